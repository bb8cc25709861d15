// Command image builds the manager's container image without a container
// engine, the way ko does (go-containerregistry, an empty base, one layer
// with the binary), and pushes it. `make image` and `make image-push` run it;
// docs/install.md#the-image says how to use what it writes.
//
//	image build --binary bin/linux-amd64/manager --arch amd64 --ref REGISTRY/REPOSITORY:TAG --revision SHA \
//	    --tarball bin/image.tar --oci-layout bin/image-oci [--created UNIX-SECONDS]
//	image push --oci-layout bin/image-oci --ref REGISTRY/REPOSITORY:TAG
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 1 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	switch args[0] {
	case "build":
		return runBuild(ctx, args[1:])
	case "push":
		return runPush(ctx, args[1:])
	}
	usage()
	return nil
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: image build|push [flags] (image build -h, image push -h)")
	os.Exit(2)
}

func runBuild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	binary := fs.String("binary", "", "the manager, built for linux/ARCH with CGO_ENABLED=0")
	arch := fs.String("arch", "amd64", "the binary's GOARCH; the image's platform is linux/ARCH")
	ref := fs.String("ref", "", "image name REGISTRY/REPOSITORY:TAG (the tarball's tag; TAG is the version label)")
	tarPath := fs.String("tarball", "", "write a docker archive here (docker load, kind load image-archive)")
	layoutDir := fs.String("oci-layout", "", "write an OCI image layout here (what push sends)")
	source := fs.String("source", "https://github.com/fencekeeper/fencekeeper", "label "+LabelSource)
	version := fs.String("version", "", "label "+LabelVersion+" (default: the tag of --ref)")
	revision := fs.String("revision", "", "label "+LabelRevision+": the commit built (git rev-parse HEAD)")
	// The repository has no license file; SPDX's NOASSERTION says so rather
	// than claiming one.
	licenses := fs.String("licenses", "NOASSERTION", "label "+LabelLicenses+" (an SPDX expression)")
	created := fs.String("created", "", "creation time in Unix seconds (SOURCE_DATE_EPOCH; the commit time keeps the digest reproducible); empty: 0")
	run := fs.Bool("run", true, "after writing, run the image's entrypoint with --help when the image is this machine's platform")
	_ = fs.Parse(args)
	if *binary == "" || *ref == "" || (*tarPath == "" && *layoutDir == "") {
		return errors.New("build needs --binary, --ref and --tarball or --oci-layout")
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--ref %q: %w (want REGISTRY/REPOSITORY:TAG)", *ref, err)
	}
	if *revision == "" {
		return errors.New("--revision is empty: pass the commit (git rev-parse HEAD)")
	}
	var secs int64
	if *created != "" {
		if secs, err = strconv.ParseInt(*created, 10, 64); err != nil {
			return fmt.Errorf("--created %q: want Unix seconds: %w", *created, err)
		}
	}
	img, err := Build(Spec{Binary: *binary, Arch: *arch, Ref: tag, Source: *source, Version: *version, Revision: *revision,
		Licenses: *licenses, Created: time.Unix(secs, 0)})
	if err != nil {
		return err
	}
	if *tarPath != "" {
		if err := WriteTarball(*tarPath, tag, img); err != nil {
			return err
		}
	}
	if *layoutDir != "" {
		if err := WriteLayout(*layoutDir, tag, img); err != nil {
			return err
		}
		// Check what was written, not what is in memory.
		if img, err = ImageFromLayout(*layoutDir); err != nil {
			return err
		}
	}
	facts, err := Inspect(img)
	if err != nil {
		return err
	}
	if err := facts.Check(); err != nil {
		return err
	}
	ran := "not run (the image is " + facts.Platform + ", this machine " + hostPlatform() + ")"
	if *run && facts.Platform == hostPlatform() {
		if out, err := facts.RunEntrypoint(ctx, "--help"); err != nil {
			return fmt.Errorf("the image's entrypoint does not run: %w\n%s", err, out)
		}
		ran = "runs (--help)"
	}
	fmt.Printf("built %s (%s, %s) digest %s; entrypoint %s %s, user %s\n", tag, facts.Platform, *revision, facts.Digest,
		facts.Entrypoint[0], ran, facts.User)
	for _, p := range []string{*tarPath, *layoutDir} {
		if p != "" {
			fmt.Println("  wrote", p)
		}
	}
	return nil
}

func runPush(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	layoutDir := fs.String("oci-layout", "", "the OCI layout `image build` wrote")
	ref := fs.String("ref", "", "where to push: REGISTRY/REPOSITORY:TAG")
	_ = fs.Parse(args)
	if *layoutDir == "" || *ref == "" {
		return errors.New("push needs --oci-layout and --ref REGISTRY/REPOSITORY:TAG")
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--ref %q: %w (want REGISTRY/REPOSITORY:TAG)", *ref, err)
	}
	img, err := ImageFromLayout(*layoutDir)
	if err != nil {
		return fmt.Errorf("%w (run make image first)", err)
	}
	d, err := Push(ctx, img, tag)
	if err != nil {
		return fmt.Errorf("pushing %s: %w (log in first: docker login %s)", tag, err, tag.RegistryStr())
	}
	fmt.Printf("pushed %s@%s\ninstall it with: helm install fencekeeper charts/fencekeeper -n fencekeeper-system --create-namespace \\\n"+
		"  --set image.repository=%s --set image.tag=%s\n", tag, d, strings.TrimSuffix(tag.String(), ":"+tag.TagStr()), tag.TagStr())
	return nil
}
