package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// standIn is the manager's stand-in: a static linux binary with a flag, so
// --help behaves like the manager's (usage on stderr, exit 0).
const standIn = `package main

import (
	"flag"
	"fmt"
)

func main() {
	name := flag.String("stand-in-flag", "", "a flag only the stand-in has")
	flag.Parse()
	fmt.Println("stand-in manager", *name)
}
`

// buildStandIn compiles standIn for linux/arch with CGO_ENABLED=0, as make
// image builds the manager.
func buildStandIn(t *testing.T, arch string) string {
	t.Helper()
	dir := t.TempDir()
	for f, body := range map[string]string{"go.mod": "module standin\n\ngo 1.26\n", "main.go": standIn} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "manager")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build the stand-in: %v\n%s", err, b)
	}
	return out
}

func testSpec(t *testing.T, binary string) Spec {
	t.Helper()
	tag, err := name.NewTag("registry.example/fencekeeper/fencekeeper:v1.2.3", name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	return Spec{Binary: binary, Arch: runtime.GOARCH, Ref: tag, Source: "https://github.com/fencekeeper/fencekeeper",
		Revision: "0123456789abcdef0123456789abcdef01234567", Licenses: "NOASSERTION", Created: time.Unix(1_796_523_294, 0)}
}

// TestImage builds the image of a stand-in binary as make image does and
// checks it the way a runtime would read it: both outputs parse and every
// blob matches its digest, the entrypoint is an executable file of the
// flattened filesystem that runs, the user is not root, the labels are set.
func TestImage(t *testing.T) {
	bin := buildStandIn(t, runtime.GOARCH)
	spec := testSpec(t, bin)
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	tarPath, layoutDir := filepath.Join(out, "image.tar"), filepath.Join(out, "image-oci")
	if err := WriteTarball(tarPath, spec.Ref, img); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(layoutDir, spec.Ref, img); err != nil {
		t.Fatal(err)
	}

	// The docker archive: what docker load and kind load image-archive read.
	fromTar, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		t.Fatalf("the tarball does not parse: %v", err)
	}
	if err := validate.Image(fromTar); err != nil {
		t.Fatalf("the tarball's image: %v", err)
	}
	tm, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
	if err != nil {
		t.Fatal(err)
	}
	if len(tm) != 1 || !slices.Equal(tm[0].RepoTags, []string{spec.Ref.String()}) {
		t.Errorf("tarball manifest.json: want one image tagged %s, got %+v", spec.Ref, tm)
	}

	// The OCI layout: a valid index with one manifest for this platform,
	// named by its tag.
	var lv struct {
		ImageLayoutVersion string `json:"imageLayoutVersion"`
	}
	if b, err := os.ReadFile(filepath.Join(layoutDir, "oci-layout")); err != nil || json.Unmarshal(b, &lv) != nil || lv.ImageLayoutVersion != "1.0.0" {
		t.Errorf("oci-layout file: %s, %v", b, err)
	}
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("the OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("the OCI layout holds %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 || desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != runtime.GOARCH ||
		desc.Annotations[refName] != "v1.2.3" || desc.Annotations[containerdName] != spec.Ref.String() {
		t.Errorf("the layout's manifest descriptor: %+v (platform %+v)", desc, desc.Platform)
	}
	fromLayout, err := ImageFromLayout(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := fromLayout.Manifest(); err != nil || m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer ||
		m.Annotations[LabelRevision] != spec.Revision {
		t.Errorf("manifest: %+v, %v", m, err)
	}
	// Both outputs hold the same config and layer.
	for _, f := range []func(v1.Image) (v1.Hash, error){v1.Image.ConfigName, func(i v1.Image) (v1.Hash, error) {
		ls, err := i.Layers()
		if err != nil {
			return v1.Hash{}, err
		}
		return ls[0].Digest()
	}} {
		a, errA := f(fromTar)
		b, errB := f(fromLayout)
		if errA != nil || errB != nil || a != b {
			t.Errorf("the tarball and the layout differ: %v (%v) vs %v (%v)", a, errA, b, errB)
		}
	}

	// The config.
	cf, err := fromTar.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/manager"}) || cf.Config.Cmd != nil || cf.Config.WorkingDir != "/" {
		t.Errorf("entrypoint %q, cmd %q, workdir %q", cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.WorkingDir)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cf.Config.User)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || !cf.Created.Equal(spec.Created) {
		t.Errorf("platform %s/%s, created %v", cf.OS, cf.Architecture, cf.Created)
	}
	for k, want := range map[string]string{
		LabelSource: "https://github.com/fencekeeper/fencekeeper", LabelVersion: "v1.2.3", LabelRevision: spec.Revision,
		LabelTitle: "fencekeeper", LabelLicenses: "NOASSERTION", LabelCreated: "2026-12-06T02:14:54Z",
	} {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}

	// The flattened filesystem.
	files, binary := flatten(t, fromTar, "/manager")
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if h := files["/manager"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o755 || h.Uid != 0 || string(binary) != string(want) {
		t.Fatalf("/manager: %+v (the entrypoint must be the binary, mode 0755)", h)
	}
	if h := files["/tmp"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
		t.Errorf("/tmp: %+v, want a directory with mode 1777", h)
	}
	if h := files["/home/nonroot"]; h == nil || h.Uid != UID || h.Gid != GID {
		t.Errorf("/home/nonroot: %+v, want owned by 65532", h)
	}
	_, passwd := flatten(t, fromTar, "/etc/passwd")
	if !strings.Contains(string(passwd), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot user:\n%s", passwd)
	}

	// The entrypoint runs: copied out of the image, executed.
	if runtime.GOOS != "linux" {
		// Not skipped: an image whose entrypoint was never run is not
		// tested. make test runs on linux.
		t.Fatalf("running the image's linux entrypoint needs a linux machine, not %s", runtime.GOOS)
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "manager")
	if err := os.WriteFile(exe, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	help, err := exec.Command(exe, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(help), "-stand-in-flag") {
		t.Errorf("the entrypoint --help: %v\n%s", err, help)
	}
	if got, err := exec.Command(exe, "--stand-in-flag=ran").Output(); err != nil || string(got) != "stand-in manager ran\n" {
		t.Errorf("the entrypoint: %q, %v", got, err)
	}

	// What `image build` checks after writing (make image) agrees, on
	// the image as built and as read back.
	if facts, err := Inspect(img); err != nil {
		t.Errorf("the image as built: %v", err)
	} else if err := facts.Check(); err != nil {
		t.Errorf("the image as built: %v", err)
	}
	facts, err := Inspect(fromLayout)
	if err != nil {
		t.Fatal(err)
	}
	if err := facts.Check(); err != nil {
		t.Errorf("Check: %v", err)
	}
	if out, err := facts.RunEntrypoint(context.Background(), "--help"); err != nil || !strings.Contains(out, "-stand-in-flag") {
		t.Errorf("RunEntrypoint --help: %v\n%s", err, out)
	}
}

// flatten returns the image's flattened filesystem by path, and the
// contents of one file.
func flatten(t *testing.T, img v1.Image, path string) (map[string]*tar.Header, []byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]*tar.Header{}
	var body []byte
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, body
		}
		if err != nil {
			t.Fatal(err)
		}
		p := "/" + strings.Trim(h.Name, "/")
		files[p] = h
		if p == path {
			if body, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestReproducible: the same binary, commit and time give the same digest.
func TestReproducible(t *testing.T) {
	spec := testSpec(t, buildStandIn(t, runtime.GOARCH))
	digest := func(s Spec) v1.Hash {
		img, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := digest(spec), digest(spec)
	if a != b {
		t.Errorf("two builds of the same input: %s and %s", a, b)
	}
	spec.Created = spec.Created.Add(time.Second)
	if c := digest(spec); c == a {
		t.Errorf("a different creation time gave the same digest %s", c)
	}
}

// TestRefusesWhatCannotRun: a binary that would not start on an empty base,
// or an image without a runnable non-root entrypoint or its labels.
func TestRefusesWhatCannotRun(t *testing.T) {
	bin := buildStandIn(t, runtime.GOARCH)
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	script := filepath.Join(t.TempDir(), "manager")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, binary, arch, want string
	}{
		{"not ELF", script, runtime.GOARCH, "not a linux (ELF) binary"},
		{"another architecture", bin, other, "build it with GOARCH=" + other},
		{"unknown architecture", bin, "wasm", `unsupported architecture "wasm"`},
	} {
		spec := testSpec(t, c.binary)
		spec.Arch = c.arch
		if _, err := Build(spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	spec := testSpec(t, bin)
	spec.Revision = ""
	if _, err := Build(spec); err == nil || !strings.Contains(err.Error(), LabelRevision) {
		t.Errorf("no revision: got %v", err)
	}

	img, err := Build(testSpec(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(*v1.Config)
		want string
	}{
		{"root user", func(c *v1.Config) { c.User = "0:0" }, `user "0:0" is not a numeric non-root UID`},
		{"named user", func(c *v1.Config) { c.User = "nonroot" }, `user "nonroot" is not a numeric non-root UID`},
		{"no such entrypoint", func(c *v1.Config) { c.Entrypoint = []string{"/ko-app/manager"} }, "entrypoint /ko-app/manager is not a file"},
		{"a directory as entrypoint", func(c *v1.Config) { c.Entrypoint = []string{"/tmp"} }, "entrypoint /tmp is not a file"},
		{"labels gone", func(c *v1.Config) { c.Labels = nil }, "labels missing: " + LabelSource},
	} {
		cfg := *cf.Config.DeepCopy()
		c.edit(&cfg)
		bad, err := mutate.Config(img, cfg)
		if err != nil {
			t.Fatal(err)
		}
		facts, err := Inspect(bad)
		if err != nil {
			t.Fatal(err)
		}
		if err := facts.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Check gave %v, want %q", c.name, err, c.want)
		}
	}
}

// TestBuildAndPushCommands runs `image build` as make image does and `image
// push` as make image-push does, against an in-process registry on
// loopback; the registry then serves exactly the manifest of the layout.
func TestBuildAndPushCommands(t *testing.T) {
	// No docker credentials of this machine's: an anonymous push.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	bin := buildStandIn(t, runtime.GOARCH)
	out := t.TempDir()
	layoutDir := filepath.Join(out, "image-oci")
	ctx := context.Background()
	if err := runBuild(ctx, []string{"--binary", bin, "--arch", runtime.GOARCH, "--ref", "registry.example/fencekeeper:dev",
		"--revision", "abc123", "--created", "1796523294", "--tarball", filepath.Join(out, "image.tar"), "--oci-layout", layoutDir}); err != nil {
		t.Fatal(err)
	}
	built, err := ImageFromLayout(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	want, err := built.Digest()
	if err != nil {
		t.Fatal(err)
	}

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/fencekeeper/fencekeeper:v1"
	if err := runPush(ctx, []string{"--oci-layout", layoutDir, "--ref", ref}); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(tag)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := pulled.Digest(); err != nil || got != want {
		t.Errorf("the registry serves %s (%v), want the layout's %s", got, err, want)
	}
	if err := validate.Image(pulled); err != nil {
		t.Errorf("the pushed image: %v", err)
	}

	if err := runPush(ctx, []string{"--oci-layout", layoutDir, "--ref", "fencekeeper"}); err == nil || !strings.Contains(err.Error(), "want REGISTRY/REPOSITORY:TAG") {
		t.Errorf("a ref without registry and tag: %v", err)
	}
	if err := runBuild(ctx, []string{"--binary", bin, "--ref", "fencekeeper:dev", "--revision", "x", "--tarball", filepath.Join(out, "x.tar")}); err == nil ||
		!strings.Contains(err.Error(), "want REGISTRY/REPOSITORY:TAG") {
		t.Errorf("a Docker Hub short name: %v", err)
	}
}
