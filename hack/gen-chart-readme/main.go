// Command gen-chart-readme writes charts/fencekeeper/README.md from the
// `# -- description` comments in values.yaml (helm-docs style), so the
// chart's documentation cannot drift from its values (run by make manifests).
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

type row struct{ key, def, doc string }

func main() {
	chart := "charts/fencekeeper"
	if len(os.Args) > 1 {
		chart = os.Args[1]
	}
	f, err := os.Open(chart + "/values.yaml")
	if err != nil {
		fail(err)
	}
	defer f.Close()
	var rows []row
	var path []string // key path by indentation level (2 spaces)
	var doc []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "# --"):
			doc = []string{strings.TrimSpace(strings.TrimPrefix(trimmed, "# --"))}
			continue
		case strings.HasPrefix(trimmed, "#") && doc != nil:
			doc = append(doc, strings.TrimSpace(strings.TrimPrefix(trimmed, "#")))
			continue
		case trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "- "):
			continue
		}
		level := (len(line) - len(strings.TrimLeft(line, " "))) / 2
		key, val, _ := strings.Cut(trimmed, ":")
		if level < len(path) {
			path = path[:level]
		}
		path = append(path, key)
		if doc != nil {
			def := strings.TrimSpace(val)
			if def == "" {
				def = "see values.yaml"
			}
			rows = append(rows, row{key: strings.Join(path, "."), def: def, doc: strings.Join(doc, " ")})
			doc = nil
		}
	}
	if err := sc.Err(); err != nil {
		fail(err)
	}
	var b strings.Builder
	b.WriteString("# fencekeeper Helm chart\n\n<!-- Generated from values.yaml by hack/gen-chart-readme (make manifests); do not edit. -->\n\n")
	b.WriteString("Distributed locks for Kubernetes workloads, with fencing tokens enforced at the protected object.\n\n")
	b.WriteString("No image is published: build and push one first (`make image-push IMG=REGISTRY/REPOSITORY:TAG`, or `make image` and\n" +
		"`kind load image-archive bin/image.tar` for kind; [docs/install.md](../../docs/install.md#the-image)). Without\n" +
		"`image.repository` the install fails and says so.\n\n")
	b.WriteString("```sh\nhelm install fencekeeper charts/fencekeeper -n fencekeeper-system --create-namespace \\\n" +
		"  --set image.repository=REGISTRY/REPOSITORY --set image.tag=TAG\n```\n\n")
	b.WriteString("Values are checked by `values.schema.json`: wrong types and unknown keys are rejected.\n\n")
	b.WriteString("| key | default | description |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", r.key, strings.ReplaceAll(r.def, "|", "\\|"), r.doc)
	}
	if err := os.WriteFile(chart+"/README.md", []byte(b.String()), 0o644); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gen-chart-readme:", err)
	os.Exit(1)
}
