package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// TestDocsDiff applies docs/leader-election.md's diff to a kubebuilder
// scaffold's main.go and builds the result: the adoption the docs show
// compiles as written.
func TestDocsDiff(t *testing.T) {
	root := envtestutil.RepoRoot()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "leader-election.md"))
	if err != nil {
		t.Fatal(err)
	}
	diff, ok := fenced(string(doc), "```diff")
	if !ok {
		t.Fatal("docs/leader-election.md has no ```diff block")
	}
	scaffold, err := os.ReadFile(filepath.Join("testdata", "scaffold-main.go.txt"))
	if err != nil {
		t.Fatal(err)
	}
	patched, err := applyDiff(string(scaffold), diff)
	if err != nil {
		t.Fatalf("the docs' diff does not apply to the scaffold: %v", err)
	}
	if !strings.Contains(patched, "lock.ManagerOptions(") {
		t.Fatal("the patched main.go does not use lock.ManagerOptions")
	}
	// Inside the module (for its go.mod), in a directory ./... skips.
	dir, err := os.MkdirTemp(filepath.Join(root, "hack", "demo-leader"), ".docs-diff-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(patched), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the scaffold with the docs' diff applied does not build: %v\n%s\n--- main.go:\n%s", err, out, patched)
	}
}

// fenced is the body of the first code block opened by open.
func fenced(doc, open string) (string, bool) {
	i := strings.Index(doc, open+"\n")
	if i < 0 {
		return "", false
	}
	body := doc[i+len(open)+1:]
	j := strings.Index(body, "```")
	if j < 0 {
		return "", false
	}
	return body[:j], true
}

// applyDiff applies a unified diff's hunks (separated by @@ lines; ' ' keeps,
// '-' removes, '+' adds) in order, each where its old lines first appear
// after the previous hunk.
func applyDiff(src, diff string) (string, error) {
	lines := strings.Split(src, "\n")
	var hunks [][]string
	cur := []string{}
	for _, l := range strings.Split(strings.TrimRight(diff, "\n"), "\n") {
		if strings.HasPrefix(l, "@@") {
			hunks = append(hunks, cur)
			cur = []string{}
			continue
		}
		cur = append(cur, l)
	}
	hunks = append(hunks, cur)
	at := 0
	for n, h := range hunks {
		var old, repl []string
		for _, l := range h {
			op, text := " ", ""
			if l != "" {
				op, text = l[:1], l[1:]
			}
			switch op {
			case " ":
				old, repl = append(old, text), append(repl, text)
			case "-":
				old = append(old, text)
			case "+":
				repl = append(repl, text)
			default:
				return "", fmt.Errorf("hunk %d: line %q has no diff prefix", n+1, l)
			}
		}
		pos := -1
		for i := at; i+len(old) <= len(lines) && pos < 0; i++ {
			if equal(lines[i:i+len(old)], old) {
				pos = i
			}
		}
		if pos < 0 {
			return "", fmt.Errorf("hunk %d: its old lines are not in the file:\n%s", n+1, strings.Join(old, "\n"))
		}
		lines = append(lines[:pos], append(append([]string{}, repl...), lines[pos+len(old):]...)...)
		at = pos + len(repl)
	}
	return strings.Join(lines, "\n"), nil
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
