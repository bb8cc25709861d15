package docs

import (
	"reflect"
	"testing"
)

func TestExtract(t *testing.T) {
	text := "# T\n\n## Tour\n\n```sh\nexport A=1   \n# a comment\n\nkubectl get x\n```\n\n" +
		"```console\n$ kubectl apply -f - <<EOF\nkind: X\nEOF\nx/y created\n$ kubectl patch x y \\\n    -p '{}'\nError from server (Conflict): ... denied\n```\n\n" +
		"<!-- docs-test: skip needs alice -->\n```console\n$ kubectl --as alice get x\n```\n\n```yaml\nkind: X\n```\n\n" +
		"## Other\n\n```sh\nnot-in-the-section\n```\n"
	got, err := Extract("f.md", text, "## Tour")
	if err != nil {
		t.Fatal(err)
	}
	want := []Command{
		{Where: "f.md:6", Script: "export A=1   "},
		{Where: "f.md:9", Script: "kubectl get x"},
		{Where: "f.md:13", Script: "kubectl apply -f - <<EOF\nkind: X\nEOF", Shown: []string{"x/y created"}},
		{Where: "f.md:17", Script: "kubectl patch x y \\\n    -p '{}'", Shown: []string{"Error from server (Conflict): ... denied"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Extract:\n got %#v\nwant %#v", got, want)
	}
	if got[2].FailureExpected() || !got[3].FailureExpected() {
		t.Fatal("FailureExpected: only the refused patch is expected to fail")
	}
	if _, err := Extract("f.md", "```sh\nx \\\n```\n", ""); err == nil {
		t.Fatal("a block ending in a continued line must be an error")
	}
}

func TestMissing(t *testing.T) {
	got := "NAME                LOCK             HOLDER   PHASE     EPOCH   AGE\n" +
		"w1-report-2026-07   report-2026-07   W1       Held      90211   13s\n" +
		`Error from server (Conflict): error when applying patch: admission webhook "fenced.fencekeeper.io" denied the request: stale epoch 90211`
	for _, tc := range []struct {
		shown   string
		missing bool
	}{
		{"w1-report-2026-07   report-2026-07   W1       Held      4711    2s", false},
		{"w1-report-2026-07 report-2026-07 W2 Held 4711 2s", true},
		{"w1-report-2026-07   report-2026-07   W1       Pending      4711    2s", true},
		{`Error from server (Conflict): ... admission webhook "fenced.fencekeeper.io" denied the request:`, false},
		{"stale epoch 4711", false},
		{"configmap/report-2026-07 created", true},
	} {
		m := Missing([]string{tc.shown}, got)
		if (len(m) > 0) != tc.missing {
			t.Errorf("%q: missing = %v, want missing %v", tc.shown, m, tc.missing)
		}
	}
}
