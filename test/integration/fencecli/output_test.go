package fencecli_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// fenceOK runs the plugin in ns and returns its stdout; it must succeed.
func fenceOK(ns string, args ...string) string {
	code, stdout, stderr := fenceExit(ns, nil, args...)
	ExpectWithOffset(1, code).To(Equal(0), "kubectl fence %v: %s", args, stderr)
	return stdout
}

// claimOf is the name of holder's claim of lock in ns.
func claimOf(ns, lock, holder string) string {
	for _, cl := range claimsIn(ns) {
		if cl.Spec.LockName == lock && cl.Spec.HolderIdentity == holder {
			return cl.Name
		}
	}
	Fail(fmt.Sprintf("no claim of %s/%s by %s", ns, lock, holder))
	return ""
}

var _ = Describe("kubectl fence output, as kubectl's", func() {
	newNS := func(prefix string) string {
		ns, err := envtestutil.NewNamespace(ctx, admin, prefix)
		Expect(err).NotTo(HaveOccurred())
		return ns
	}

	It("lists the locks of every namespace with -A, with a NAMESPACE column, and says where it looked when it finds none", func() {
		ns1, ns2, empty := newNS("all-a"), newNS("all-b"), newNS("all-empty")
		fenceOK(ns1, "acquire", "alpha", "--holder", "W1", "--ttl", "60s")
		fenceOK(ns2, "acquire", "beta", "--holder", "W2", "--ttl", "60s")

		By("no lock in the namespace: nothing on stdout, kubectl's message on stderr")
		code, stdout, stderr := fenceExit(empty, nil, "status")
		Expect(code).To(Equal(0), stderr)
		Expect(stdout).To(BeEmpty())
		Expect(stderr).To(Equal(fmt.Sprintf("No locks found in %s namespace.\n", empty)))
		By("and -o json prints an empty list, with no message")
		code, stdout, stderr = fenceExit(empty, nil, "status", "-o", "json")
		Expect(code).To(Equal(0), stderr)
		Expect(stderr).To(BeEmpty())
		var none []map[string]any
		Expect(json.Unmarshal([]byte(stdout), &none)).To(Succeed(), stdout)
		Expect(none).NotTo(BeNil())
		Expect(none).To(BeEmpty())

		By("-A lists both namespaces' locks and ignores -n (here the empty namespace)")
		out := fenceOK(empty, "status", "-A")
		Expect(out).To(MatchRegexp(`^NAMESPACE\s+LOCK\s+HOLDER\s+EPOCH\s+HELD FOR\s+TTL LEFT\s+QUEUE\s+OLDEST WAIT\n`))
		Expect(out).To(MatchRegexp(`(?m)^%s\s+alpha\s+W1\s+[1-9][0-9]*\s+~\d+s\s+~\S+\s+0 waiting \[\]\s+-$`, ns1))
		Expect(out).To(MatchRegexp(`(?m)^%s\s+beta\s+W2\s+[1-9][0-9]*\s+~\d+s\s+~\S+\s+0 waiting \[\]\s+-$`, ns2))
		out = fenceOK(empty, "status", "--all-namespaces", "-o", "wide")
		Expect(out).To(MatchRegexp(`^NAMESPACE\s+LOCK\s+HOLDER\s+.*\s+OLDEST WAIT\s+CLAIM\s+TTL\s+USER\n`))
		Expect(out).To(MatchRegexp(`(?m)^%s\s+alpha\s+W1\s+.*\s+%s\s+1m0s\s+\S+$`, ns1, claimOf(ns1, "alpha", "W1")))

		var all []map[string]any
		Expect(json.Unmarshal([]byte(fenceOK(empty, "status", "-A", "-o", "json")), &all)).To(Succeed())
		var found []string
		for _, l := range all {
			found = append(found, fmt.Sprintf("%s/%s", l["namespace"], l["lock"]))
		}
		Expect(found).To(ContainElements(ns1+"/alpha", ns2+"/beta"))
		Expect(strings.Split(fenceOK(empty, "status", "-A", "-o", "name"), "\n")).
			To(ContainElements("lease.coordination.k8s.io/alpha", "lease.coordination.k8s.io/beta"))

		By("without -A, one namespace and no NAMESPACE column, as before")
		out = fenceOK(ns1, "status")
		Expect(out).To(HavePrefix("LOCK "))
		Expect(out).To(ContainSubstring("alpha"))
		Expect(out).NotTo(ContainSubstring("beta"))
	})

	It("prints status, acquire, release and break with -o wide, name, json, yaml, jsonpath and go-template", func() {
		ns := newNS("output")

		By("acquire: jsonpath, name")
		epoch := fenceOK(ns, "acquire", "report", "--holder", "W1", "--ttl", "60s", "-o", "jsonpath={.epoch}")
		Expect(epoch).To(MatchRegexp(`^[1-9][0-9]*$`))
		e1, err := strconv.ParseInt(epoch, 10, 64)
		Expect(err).NotTo(HaveOccurred())
		claim := claimOf(ns, "report", "W1")
		Expect(fenceOK(ns, "acquire", "other", "--holder", "W1", "--ttl", "60s", "-o", "name")).
			To(Equal(fmt.Sprintf("fencedlease.fencekeeper.io/%s\n", claimOf(ns, "other", "W1"))))
		fenceOK(ns, "acquire", "third", "--holder", "W9", "--ttl", "60s", "-o", "yaml")

		By("status: the default table is as before; -o wide adds the claim, the TTL and the user")
		Expect(fenceOK(ns, "status", "report")).To(MatchRegexp(
			`^LOCK\s+HOLDER\s+EPOCH\s+HELD FOR\s+TTL LEFT\s+QUEUE\s+OLDEST WAIT\nreport\s+W1\s+%d\s+~\d+s\s+~\S+\s+0 waiting \[\]\s+-\n$`, e1))
		Expect(fenceOK(ns, "status", "report", "-o", "wide")).To(MatchRegexp(
			`^LOCK\s+HOLDER\s+EPOCH\s+HELD FOR\s+TTL LEFT\s+QUEUE\s+OLDEST WAIT\s+CLAIM\s+TTL\s+USER\nreport\s+W1\s+%d\s+~\d+s\s+~\S+\s+0 waiting \[\]\s+-\s+%s\s+1m0s\s+\S+\n$`, e1, claim))

		By("status: jsonpath and go-template see a List of the locks, as with kubectl get")
		Expect(fenceOK(ns, "status", "report", "-o", "jsonpath={.items[0].holder} {.items[0].epoch} {.items[0].claim}")).
			To(Equal(fmt.Sprintf("W1 %d %s", e1, claim)))
		Expect(fenceOK(ns, "status", "-o", `go-template={{range .items}}{{.lock}}={{.holder}}{{"\n"}}{{end}}`)).
			To(Equal("other=W1\nreport=W1\nthird=W9\n"))
		Expect(fenceOK(ns, "status", "--template", `{{.kind}} {{len .items}}`)).To(Equal("List 3"))
		Expect(fenceOK(ns, "status", "-o", "jsonpath={range .items[*]}{.lock}{\"\\n\"}{end}")).To(Equal("other\nreport\nthird\n"))

		By("status: -o json|yaml print the list itself, as before; -o name the locks' Leases")
		var locks []map[string]any
		Expect(yaml.Unmarshal([]byte(fenceOK(ns, "status", "-o", "yaml")), &locks)).To(Succeed())
		Expect(locks).To(HaveLen(3))
		Expect(locks[1]).To(HaveKeyWithValue("lock", "report"))
		Expect(locks[1]).To(HaveKeyWithValue("ttl", "1m0s"))
		Expect(fenceOK(ns, "status", "report", "-o", "name")).To(Equal("lease.coordination.k8s.io/report\n"))
		Expect(fenceOK(ns, "status", "-o", "name")).To(Equal(
			"lease.coordination.k8s.io/other\nlease.coordination.k8s.io/report\nlease.coordination.k8s.io/third\n"))

		By("release: -o json says what was released; -o name names the claim")
		var rel map[string]any
		Expect(json.Unmarshal([]byte(fenceOK(ns, "release", claim, "-o", "json")), &rel)).To(Succeed())
		Expect(rel).To(HaveKeyWithValue("namespace", ns))
		Expect(rel).To(HaveKeyWithValue("claim", claim))
		Expect(rel).To(HaveKeyWithValue("lock", "report"))
		Expect(rel).To(HaveKeyWithValue("holder", "W1"))
		Expect(rel).To(HaveKeyWithValue("epoch", BeNumerically("==", e1)))
		other := claimOf(ns, "other", "W1")
		Expect(fenceOK(ns, "release", "--lock", "other", "--holder", "W1", "-o", "name")).
			To(Equal("fencedlease.fencekeeper.io/" + other + "\n"))
		Expect(fenceOK(ns, "release", "--lock", "other", "--holder", "W1", "--ignore-not-found", "-o", "name")).To(BeEmpty())

		By("break: -o json says which hold ended and how; -o name names its claim")
		third := claimOf(ns, "third", "W9")
		var br map[string]any
		Expect(json.Unmarshal([]byte(fenceOK(ns, "break", "third", "--reason", "output test", "-o", "json")), &br)).To(Succeed())
		Expect(br).To(HaveKeyWithValue("claim", third))
		Expect(br).To(HaveKeyWithValue("holder", "W9"))
		Expect(br).To(HaveKeyWithValue("reason", "output test"))
		Expect(br).To(HaveKeyWithValue("ended", true))
		Expect(br).To(HaveKeyWithValue("endReason", fkv1.ReasonForcedRelease))
		fenceOK(ns, "acquire", "fourth", "--holder", "W4", "--ttl", "60s")
		Expect(fenceOK(ns, "break", "fourth", "--reason", "output test", "--wait", "0", "-o", "name")).
			To(Equal("fencedlease.fencekeeper.io/" + claimOf(ns, "fourth", "W4") + "\n"))
	})
})
