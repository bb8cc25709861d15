package localpods

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestRewriteArgs(t *testing.T) {
	ports := []portMap{{name: "webhook", container: 9443, host: 41001}, {name: "metrics", container: 8080, host: 41002}, {name: "health", container: 8081, host: 41003}}
	mounts := map[string]string{"/certs": "/tmp/p/volumes/certs", "/var/run/secrets/kubernetes.io/serviceaccount": "/tmp/p/serviceaccount", "/opaque": ""}
	// The chart's manager arguments, as the Deployment renders them.
	args := []string{"--leader-elect", "--leader-election-namespace=fencekeeper-system", "--metrics-bind-address=:8080",
		"--health-probe-bind-address=:8081", "--webhook-port=9443", "--webhook-cert-dir=/certs", "--cert-rotation=true",
		"--expired-claim-retention=24h", "--max-waiters-per-lock=1000", "--certs-copy", "/certs/ca.crt"}
	got, err := rewriteArgs(args, mounts, ports)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--leader-elect", "--leader-election-namespace=fencekeeper-system", "--metrics-bind-address=:41002",
		"--health-probe-bind-address=:41003", "--webhook-port=41001", "--webhook-cert-dir=/tmp/p/volumes/certs", "--cert-rotation=true",
		"--expired-claim-retention=24h", "--max-waiters-per-lock=1000", "--certs-copy", "/tmp/p/volumes/certs/ca.crt"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rewriteArgs:\n got %q\nwant %q", got, want)
	}
	if got, _ := rewriteArgs([]string{"--bind=0.0.0.0:8080", "9443", "--x=:8081", "--certsx=/certsx"}, mounts, ports); !reflect.DeepEqual(got,
		[]string{"--bind=0.0.0.0:41002", "41001", "--x=:41003", "--certsx=/certsx"}) {
		t.Errorf("host:port, a bare value, a path that only starts like a mount path: %q", got)
	}

	if _, err := rewriteArgs([]string{"--webhook-port=9443", "--metrics-bind-address=:8080"}, mounts, ports); err == nil || !strings.Contains(err.Error(), "container port 8081 (health)") {
		t.Errorf("a declared port no argument sets: %v, want an error naming it", err)
	}
	if _, err := rewriteArgs([]string{"--dir=/opaque/x"}, mounts, nil); err == nil || !strings.Contains(err.Error(), "/opaque") {
		t.Errorf("a mount path this package does not provide: %v, want an error naming it", err)
	}
}

func TestAtomicWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	if err := atomicWrite(dir, map[string][]byte{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tls.crt")); !os.IsNotExist(err) {
		t.Fatalf("an empty Secret's volume has tls.crt: %v", err)
	}
	if err := atomicWrite(dir, map[string][]byte{"tls.crt": []byte("c1"), "tls.key": []byte("k1"), "old": []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if read("tls.crt") != "c1" || read("tls.key") != "k1" {
		t.Fatalf("after the first write: %q %q", read("tls.crt"), read("tls.key"))
	}
	if err := atomicWrite(dir, map[string][]byte{"tls.crt": []byte("c2"), "tls.key": []byte("k2")}); err != nil {
		t.Fatal(err)
	}
	if read("tls.crt") != "c2" || read("tls.key") != "k2" {
		t.Fatalf("after the second write: %q %q", read("tls.crt"), read("tls.key"))
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 4 { // ..data, one data directory, tls.crt, tls.key
		t.Errorf("left in the volume: %q (want ..data, its directory and the two files)", names)
	}
	if err := atomicWrite(dir, map[string][]byte{"../escape": []byte("x")}); err == nil {
		t.Error("a file name leaving the volume was written")
	}
}
