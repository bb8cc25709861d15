package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// sameAs marks a code block that is a copy of a file of the repository
// that the build compiles (or a test loads): the block right after
// <!-- docs-test: same as PATH --> must be byte for byte PATH, so the
// docs cannot show code that no longer compiles.
var sameAs = regexp.MustCompile(`^<!-- docs-test: same as (\S+) -->$`)

// mustCopy are the copies that must exist: a marker removed by mistake
// would otherwise turn the check off.
var mustCopy = map[string]string{
	"docs/holders.md": "examples/quickstart/main.go",
}

// TestCodeBlocksAreTheFiles checks every marked code block of README.md and
// docs/ against its file. It needs no control plane.
func TestCodeBlocksAreTheFiles(t *testing.T) {
	root := envtestutil.RepoRoot()
	docsFiles, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, path := range append([]string{filepath.Join(root, "README.md")}, docsFiles...) {
		rel, _ := filepath.Rel(root, path)
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := markedBlocks(string(text))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		for _, b := range blocks {
			found[rel] = b.file
			want, err := os.ReadFile(filepath.Join(root, b.file))
			if err != nil {
				t.Errorf("%s:%d: %v", rel, b.line, err)
				continue
			}
			if b.text != string(want) {
				t.Errorf("%s:%d: the code block differs from %s (copy the file into the block): %s",
					rel, b.line, b.file, firstDifference(b.text, string(want)))
			}
		}
	}
	for doc, file := range mustCopy {
		if found[doc] != file {
			t.Errorf("%s has no code block marked <!-- docs-test: same as %s -->", doc, file)
		}
	}
}

type markedBlock struct {
	file string
	line int // of the block's first line of code
	text string
}

// markedBlocks returns the code blocks that directly follow a same-as
// marker, each with its text (every line with its newline).
func markedBlocks(text string) ([]markedBlock, error) {
	lines := strings.SplitAfter(text, "\n")
	var out []markedBlock
	for i := 0; i < len(lines); i++ {
		m := sameAs.FindStringSubmatch(strings.TrimRight(lines[i], "\n"))
		if m == nil {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("line %d: the marker for %s is not directly followed by a code block", i+1, m[1])
		}
		b := markedBlock{file: m[1], line: i + 3}
		var body strings.Builder
		closed := false
		for j := i + 2; j < len(lines); j++ {
			if strings.TrimRight(lines[j], "\n") == "```" {
				closed, i = true, j
				break
			}
			body.WriteString(lines[j])
		}
		if !closed {
			return nil, fmt.Errorf("line %d: the code block for %s is not closed", i+2, m[1])
		}
		b.text = body.String()
		out = append(out, b)
	}
	return out, nil
}

// firstDifference names the first line where the block and the file differ.
func firstDifference(block, file string) string {
	a, b := strings.Split(block, "\n"), strings.Split(file, "\n")
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if i >= len(a) || i >= len(b) || x != y {
			return fmt.Sprintf("line %d of the block is %q, the file has %q", i+1, x, y)
		}
	}
	return "they differ in their final newline"
}
