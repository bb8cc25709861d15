package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// What the image is. The chart runs the pod as the same user
// (runAsUser/runAsGroup 65532, runAsNonRoot) with a read-only root
// filesystem and the webhook certificate Secret mounted at /certs, so the
// manager writes nothing into the image's filesystem.
const (
	// Entrypoint is where the manager binary lives in the image.
	Entrypoint = "/manager"
	// UID and GID the image runs as: distroless's "nonroot". Numeric, so the
	// kubelet can check runAsNonRoot without reading /etc/passwd.
	UID, GID = 65532, 65532
)

// The OCI annotation keys used as image labels (and manifest annotations).
const (
	LabelSource      = "org.opencontainers.image.source"
	LabelVersion     = "org.opencontainers.image.version"
	LabelRevision    = "org.opencontainers.image.revision"
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
	LabelLicenses    = "org.opencontainers.image.licenses"
	LabelCreated     = "org.opencontainers.image.created"
	// refName names an image inside an OCI layout (its tag);
	// containerdName is the full reference `ctr images import` gives it.
	refName        = "org.opencontainers.image.ref.name"
	containerdName = "io.containerd.image.name"
)

// RequiredLabels must be present and non-empty on every image Build makes.
var RequiredLabels = []string{LabelSource, LabelVersion, LabelRevision, LabelTitle, LabelLicenses}

// Spec describes one image.
type Spec struct {
	// Binary is the manager built for linux/Arch, statically linked
	// (CGO_ENABLED=0): the base is empty, there is no libc to load.
	Binary string
	// Arch is the GOARCH the binary was built for.
	Arch string
	// Ref names the image (REGISTRY/REPOSITORY:TAG): the tag written into
	// the tarball, and the version label when Version is empty.
	Ref name.Tag
	// Source, Version, Revision and Licenses fill the OCI labels.
	Source, Version, Revision, Licenses string
	// Created stamps the config, the history and every file's mtime: the
	// commit time (SOURCE_DATE_EPOCH) makes the digest reproducible.
	Created time.Time
}

// Labels returns the image's labels.
func (s Spec) Labels() map[string]string {
	version := s.Version
	if version == "" {
		version = s.Ref.TagStr()
	}
	return map[string]string{
		LabelSource:      s.Source,
		LabelVersion:     version,
		LabelRevision:    s.Revision,
		LabelTitle:       "fencekeeper",
		LabelDescription: "fencekeeper manager: the lease authority and the fencing admission webhook",
		LabelLicenses:    s.Licenses,
		LabelCreated:     s.Created.UTC().Format(time.RFC3339),
	}
}

// Build assembles the image: no base layers (go-containerregistry's
// empty.Image; ko's default base, distroless static, cannot be pulled where
// this is built), one layer holding the binary and the few files a
// distroless "nonroot" image has (/etc/passwd and /etc/group naming the
// nonroot user, its home, a world-writable /tmp).
func Build(s Spec) (v1.Image, error) {
	for _, l := range RequiredLabels {
		if s.Labels()[l] == "" {
			return nil, fmt.Errorf("label %s is empty", l)
		}
	}
	if err := CheckBinary(s.Binary, s.Arch); err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, err
	}
	fs, err := rootFS(bin, s.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(fs)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: s.Created.UTC()}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: plainLayer{layer}, MediaType: types.OCILayer, History: v1.History{
		Created:   created,
		CreatedBy: "hack/image: " + Entrypoint + ", /etc/passwd, /etc/group, /home/nonroot, /tmp",
		Comment:   "fencekeeper manager on an empty base",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", s.Arch, created
	cf.Config.Entrypoint = []string{Entrypoint}
	cf.Config.Cmd = nil
	cf.Config.User = fmt.Sprintf("%d:%d", UID, GID)
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = s.Labels()
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, s.Labels()).(v1.Image), nil
}

// plainLayer hides the tarball layer's Descriptor method, whose empty but
// non-nil annotations would make the manifest in memory differ from its own
// JSON (validate.Image refuses that).
type plainLayer struct{ v1.Layer }

// elfMachines maps a GOARCH to the ELF machine its binaries carry.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// CheckBinary refuses what would not start on an empty base: anything but a
// linux ELF executable for arch, or one that needs a dynamic loader (a cgo
// build; the container would fail with a bare "no such file or directory").
func CheckBinary(path, arch string) error {
	want, ok := elfMachines[arch]
	if !ok {
		return fmt.Errorf("unsupported architecture %q", arch)
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not a linux (ELF) binary: %w; build it with GOOS=linux", path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%s is not an executable (ELF type %s)", path, f.Type)
	}
	if f.Machine != want {
		return fmt.Errorf("%s is built for %s, not %s: build it with GOARCH=%s", path, f.Machine, arch, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked, and the image has no libc: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// rootFS returns the layer's tar: directories and files in a fixed order
// with fixed owners, modes and times, so the same binary gives the same
// layer digest.
func rootFS(bin []byte, mtime time.Time) ([]byte, error) {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, GID)
	group := "root:x:0:\nnobody:x:65534:\n" + fmt.Sprintf("nonroot:x:%d:\n", GID)
	type entry struct {
		name     string
		mode     int64
		uid, gid int
		body     []byte // nil: a directory
	}
	entries := []entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, body: []byte(group)},
		{name: "etc/passwd", mode: 0o644, body: []byte(passwd)},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: UID, gid: GID},
		// Root-owned like the Dockerfile's COPY: the process cannot
		// replace its own binary.
		{name: strings.TrimPrefix(Entrypoint, "/"), mode: 0o755, body: bin},
		// Sticky and world-writable, as in distroless. Only used when
		// --webhook-cert-dir is left at its default (<tmp>/k8s-webhook-server);
		// the chart sets it to the Secret mounted at /certs.
		{name: "tmp/", mode: 0o1777},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime.UTC(), Format: tar.FormatPAX}
		if e.body == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteTarball writes img as a `docker save` archive tagged ref: what
// `docker load` and `kind load image-archive` read.
func WriteTarball(path string, ref name.Tag, img v1.Image) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// WriteLayout writes img as an OCI image layout in dir (replacing what was
// there), with one manifest annotated with ref: the exact manifest `push`
// sends (a docker archive keeps no manifest).
func WriteLayout(dir string, ref name.Tag, img v1.Image) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	return p.AppendImage(img,
		layout.WithAnnotations(map[string]string{refName: ref.TagStr(), containerdName: ref.String()}),
		layout.WithPlatform(v1.Platform{OS: cf.OS, Architecture: cf.Architecture}))
}

// ImageFromLayout reads the one image of an OCI layout written by WriteLayout.
func ImageFromLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s holds %d manifests, want 1 (written by make image)", dir, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// Facts are what Inspect reads back from an image.
type Facts struct {
	Digest     v1.Hash
	Platform   string
	Entrypoint []string
	User       string
	Labels     map[string]string
	// Files maps each path of the flattened filesystem (with a leading
	// slash) to its header; Binary holds the entrypoint's contents.
	Files  map[string]*tar.Header
	Binary []byte
}

// Inspect validates img (every blob's digest and size against its
// manifest, the config's diff IDs against the layers) and reads its
// config and flattened filesystem.
func Inspect(img v1.Image) (*Facts, error) {
	if err := validate.Image(img); err != nil {
		return nil, fmt.Errorf("invalid image: %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	f := &Facts{Digest: d, Platform: cf.OS + "/" + cf.Architecture, Entrypoint: cf.Config.Entrypoint, User: cf.Config.User,
		Labels: cf.Config.Labels, Files: map[string]*tar.Header{}}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the image's filesystem: %w", err)
		}
		p := "/" + strings.Trim(filepath.Clean("/"+h.Name), "/")
		f.Files[p] = h
		if len(f.Entrypoint) > 0 && p == f.Entrypoint[0] {
			if f.Binary, err = io.ReadAll(tr); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// Check lists what is wrong with an image for the chart: no runnable
// entrypoint, a root or non-numeric user, a missing label.
func (f *Facts) Check() error {
	var errs []error
	if len(f.Entrypoint) == 0 || !filepath.IsAbs(f.Entrypoint[0]) {
		errs = append(errs, fmt.Errorf("entrypoint %q is not an absolute path", f.Entrypoint))
	} else if h := f.Files[f.Entrypoint[0]]; h == nil || h.Typeflag != tar.TypeReg {
		errs = append(errs, fmt.Errorf("entrypoint %s is not a file in the image", f.Entrypoint[0]))
	} else if h.Mode&0o111 == 0 {
		errs = append(errs, fmt.Errorf("entrypoint %s is not executable (mode %o)", f.Entrypoint[0], h.Mode))
	}
	uid, _, _ := strings.Cut(f.User, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		errs = append(errs, fmt.Errorf("user %q is not a numeric non-root UID (runAsNonRoot needs one)", f.User))
	}
	keys := make([]string, 0, len(RequiredLabels))
	for _, l := range RequiredLabels {
		if f.Labels[l] == "" {
			keys = append(keys, l)
		}
	}
	if len(keys) > 0 {
		errs = append(errs, fmt.Errorf("labels missing: %s", strings.Join(keys, ", ")))
	}
	return errors.Join(errs...)
}

// RunEntrypoint copies the entrypoint out of the image into a temporary
// directory and runs it with args (e.g. --help), with no environment and a
// time limit, returning its combined output. Only for an image of this
// machine's platform.
func (f *Facts) RunEntrypoint(ctx context.Context, args ...string) (string, error) {
	if f.Platform != hostPlatform() {
		return "", fmt.Errorf("the image is %s; this machine runs %s", f.Platform, hostPlatform())
	}
	if f.Binary == nil {
		return "", errors.New("the image has no entrypoint binary")
	}
	dir, err := os.MkdirTemp("", "image-entrypoint-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, filepath.Base(f.Entrypoint[0]))
	if err := os.WriteFile(bin, f.Binary, 0o755); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, []string{}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", f.Entrypoint[0], strings.Join(args, " "), err)
	}
	return string(out), nil
}

func hostPlatform() string { return runtime.GOOS + "/" + runtime.GOARCH }

// Push sends img to ref with the credentials `docker login` (or podman's
// auth file) stored, and returns the manifest digest the registry now holds.
func Push(ctx context.Context, img v1.Image, ref name.Reference, opts ...remote.Option) (v1.Hash, error) {
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	if err := remote.Write(ref, img, opts...); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}
