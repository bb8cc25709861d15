package fencecli

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// printFlags are a command's -o (and --template) flags: kubectl's printers
// from cli-runtime for name, json, yaml, kyaml, jsonpath and go-template;
// with no -o the command's own text, and, where that text is a table
// (status), -o wide for more columns.
type printFlags struct {
	*genericclioptions.PrintFlags
	wide bool // the command has a table: -o wide is allowed
}

func newPrintFlags(wide bool) *printFlags {
	return &printFlags{PrintFlags: genericclioptions.NewPrintFlags(""), wide: wide}
}

// addFlags binds -o/--output, --template and --allow-missing-template-keys
// (not --show-managed-fields: nothing printed here has managed fields).
func (f *printFlags) addFlags(cmd *cobra.Command, plain string) {
	f.TemplatePrinterFlags.AddFlags(cmd)
	formats := f.allowedFormats()
	cmd.Flags().StringVarP(f.OutputFormat, "output", "o", "",
		fmt.Sprintf("Output format. One of: (%s). Default: %s.", strings.Join(formats, ", "), plain))
	f.OutputFlagSpecified = func() bool { return cmd.Flags().Changed("output") }
}

func (f *printFlags) allowedFormats() []string {
	formats := f.AllowedFormats()
	if f.wide {
		formats = append(formats, "wide")
	}
	return formats
}

// human reports whether the command prints its own text: no -o (and no
// --template), or -o wide.
func (f *printFlags) human() (human, wide bool) {
	format := strings.ToLower(*f.OutputFormat)
	switch {
	case format == "wide" && f.wide:
		return true, true
	case format == "" && *f.TemplatePrinterFlags.TemplateArgument == "":
		return true, false
	}
	return false, false
}

// printer is kubectl's printer for -o, or nil for the command's own text.
// A bad -o, or a template that does not parse, is an error naming the
// formats allowed; commands call it in PreRunE, before any API call.
func (f *printFlags) printer() (printers.ResourcePrinter, error) {
	if human, _ := f.human(); human {
		return nil, nil
	}
	p, err := f.ToPrinter()
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		return nil, genericclioptions.NoCompatiblePrinterError{OutputFormat: f.OutputFormat, AllowedFormats: f.allowedFormats()}
	}
	return p, err
}

func (f *printFlags) validate() error {
	_, err := f.printer()
	return err
}

// printed is what a command prints, in each form -o can ask for.
type printed struct {
	// data is what -o json|yaml|kyaml print, and what jsonpath and
	// go-template see: a struct, or a slice (status) that templates see as
	// kubectl get's do, {"apiVersion": "v1", "kind": "List", "items": [...]},
	// so that '{.items[*].lock}' works as it does with kubectl.
	data any
	// names are the objects -o name prints, as kubectl does: kind.group/name.
	names []runtime.Object
	// text prints the command's own text: no -o, or -o wide (wide set).
	text func(wide bool)
}

func (f *printFlags) print(w io.Writer, p printed) error {
	if human, wide := f.human(); human {
		p.text(wide)
		return nil
	}
	pr, err := f.printer()
	if err != nil {
		return err
	}
	if f.isName() {
		for _, obj := range p.names {
			if err := pr.PrintObj(obj, w); err != nil {
				return err
			}
		}
		return nil
	}
	data := p.data
	if isTemplate(pr) && isSlice(data) {
		data = map[string]any{"apiVersion": "v1", "kind": "List", "items": data}
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return err
	}
	// The printers print a runtime.Unknown's JSON as it is (json, yaml,
	// kyaml) or evaluate the template on it (jsonpath, go-template).
	return pr.PrintObj(&runtime.Unknown{Raw: raw, ContentType: runtime.ContentTypeJSON}, w)
}

func (f *printFlags) isName() bool { return strings.ToLower(*f.OutputFormat) == "name" }

func isTemplate(p printers.ResourcePrinter) bool {
	switch p.(type) {
	case *printers.JSONPathPrinter, *printers.GoTemplatePrinter:
		return true
	}
	return false
}

func isSlice(v any) bool { return reflect.ValueOf(v).Kind() == reflect.Slice }

// claimObject names a claim for -o name: fencedlease.fencekeeper.io/NAME.
func claimObject(ns, name string) runtime.Object {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: fkv1.GroupVersion.String(), Kind: "FencedLease"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
	}
}

// lockObject names a lock for -o name by its Lease, the object that records
// it: lease.coordination.k8s.io/LOCK.
func lockObject(ns, lock string) runtime.Object {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock},
	}
}
