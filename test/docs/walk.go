// Package docs runs the documentation's shell examples as a user would and
// checks that every output line they show still appears. Blocks fenced as
// ```sh are commands; in ```console blocks, lines starting with "$ " are
// commands (with their continuation and here-document lines) and the other
// lines are the output shown for them. In a shown line, "..." stands for any
// text and every number for any number (epochs, ages and resourceVersions
// differ from run to run). A block directly after the comment
// <!-- docs-test: skip REASON --> is not run.
package docs

import (
	"bufio"
	"fmt"
	"regexp"
	"strings"
)

// Command is one shell command of the docs and the output they show for it.
type Command struct {
	// Where is file:line of the command, for failure messages.
	Where string
	// Script is the command as typed, with continuation lines.
	Script string
	// Shown are the output lines the docs show.
	Shown []string
}

// FailureExpected: the docs show this command being refused.
func (c Command) FailureExpected() bool {
	for _, l := range c.Shown {
		if strings.HasPrefix(l, "Error from server") || strings.HasPrefix(l, "error:") || strings.HasPrefix(l, "The request is invalid") {
			return true
		}
	}
	return false
}

const skipMarker = "<!-- docs-test: skip"

var heredoc = regexp.MustCompile(`<<-?\s*'?"?([A-Za-z_]+)'?"?`)

func headingLevel(line string) int { return len(line) - len(strings.TrimLeft(line, "#")) }

// Extract returns the commands of the shell blocks in text, in order. With
// section set (a heading line, like "## A five-minute tour"), only the
// blocks under that heading, up to the next heading of its level, count.
func Extract(file, text, section string) ([]Command, error) {
	var (
		out       []Command
		inBlock   bool
		kind      string
		skip      bool
		prev      string
		inSection = section == ""
		cur       *Command
		heredocTo string
		continued bool
	)
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		where := fmt.Sprintf("%s:%d", file, n)
		if !inBlock {
			if section != "" && strings.HasPrefix(line, "#") {
				switch {
				case line == section:
					inSection = true
				case inSection && headingLevel(line) <= headingLevel(section):
					inSection = false
				}
			}
			if strings.HasPrefix(line, "```") {
				inBlock, kind = true, strings.TrimPrefix(line, "```")
				skip = strings.HasPrefix(strings.TrimSpace(prev), skipMarker) || !inSection || (kind != "sh" && kind != "console")
			}
			prev = line
			continue
		}
		if line == "```" && heredocTo == "" {
			if continued {
				return nil, fmt.Errorf("%s: the block ends in a continued line", where)
			}
			flush()
			inBlock, prev = false, line
			continue
		}
		if skip {
			continue
		}
		switch {
		case heredocTo != "":
			cur.Script += "\n" + line
			if strings.TrimSpace(line) == heredocTo {
				heredocTo = ""
			}
		case continued:
			cur.Script += "\n" + line
			continued = strings.HasSuffix(line, `\`)
		case kind == "sh" && (strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#")):
		case kind == "sh" || strings.HasPrefix(line, "$ "):
			flush()
			cmd := strings.TrimPrefix(line, "$ ")
			cur = &Command{Where: where, Script: cmd}
			continued = strings.HasSuffix(line, `\`)
			if m := heredoc.FindStringSubmatch(cmd); m != nil {
				heredocTo = m[1]
			}
		case cur == nil:
			return nil, fmt.Errorf("%s: output shown before any command in a console block", where)
		case strings.TrimSpace(line) != "":
			cur.Shown = append(cur.Shown, line)
		}
	}
	if inBlock {
		return nil, fmt.Errorf("%s: a code block is not closed", file)
	}
	return out, sc.Err()
}

var (
	digits = regexp.MustCompile(`[0-9]+`)
	spaces = regexp.MustCompile(`\s+`)
)

// Pattern is the regular expression a shown line stands for. A number
// that ends a word ("W2", "v12") is text, not a number: it stays as shown.
func Pattern(shown string) *regexp.Regexp {
	parts := strings.Split(strings.TrimSpace(shown), "...")
	for i, p := range parts {
		var b strings.Builder
		last := 0
		for _, m := range digits.FindAllStringIndex(p, -1) {
			if m[0] > 0 && isLetter(p[m[0]-1]) {
				continue
			}
			b.WriteString(regexp.QuoteMeta(p[last:m[0]]))
			b.WriteString(`[0-9]+`)
			last = m[1]
		}
		b.WriteString(regexp.QuoteMeta(p[last:]))
		parts[i] = spaces.ReplaceAllString(b.String(), `\s+`)
	}
	return regexp.MustCompile(strings.Join(parts, ".*"))
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// Missing returns the shown lines that no line of got matches.
func Missing(shown []string, got string) []string {
	var missing []string
	lines := strings.Split(got, "\n")
	for _, s := range shown {
		re, found := Pattern(s), false
		for _, l := range lines {
			if re.MatchString(l) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, s)
		}
	}
	return missing
}
