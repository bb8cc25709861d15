package envtestutil

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// SuiteOptions says what StartSuite starts for a test suite.
type SuiteOptions struct {
	// Log, when set, is where controller-runtime's logger writes (in
	// development mode): a ginkgo suite passes GinkgoWriter.
	Log io.Writer
	// Guarded, when non-nil, makes the control plane StartAdmissionEnv's:
	// the fencing webhook registered for these kinds, the manager identity,
	// the Lease guard and the claim policies installed. Nil: a plain
	// control plane (New) with fencekeeper's CRDs and no policy.
	Guarded []string
	// CRDDirs are more CRD directories to install (test/crds, say).
	CRDDirs []string
	// ReplaceCRDs installs only CRDDirs, not fencekeeper's own CRDs (a
	// Helm chart installs those itself). Plain control plane only.
	ReplaceCRDs bool
	// ClaimIdentity installs the claim-identity policy naming the identity
	// Client uses (a plain control plane; an admission one has it already).
	ClaimIdentity bool
	// Manager starts an in-process manager serving the fencing webhook
	// (admission control plane only); Stop stops it.
	Manager bool
	// Scheme is Client's scheme (nil: Scheme()).
	Scheme *runtime.Scheme
}

// Suite is what StartSuite started: a test suite's control plane, an admin
// client of it and, if asked for, a manager.
type Suite struct {
	Env *envtest.Environment
	// Config is the admin's: cluster-admin, not the manager.
	Config *rest.Config
	// Client is an admin client with SuiteOptions.Scheme.
	Client client.WithWatch
	// Admission is the admission control plane (nil for a plain one).
	Admission *AdmissionEnv
	// Manager is the in-process manager (SuiteOptions.Manager), or nil;
	// Stop stops it. A suite whose specs replace the manager sets the
	// current one here before Stop.
	Manager *Manager
}

// StartSuite starts a test suite's control plane as o says, and an admin
// client of it: the bootstrap of a suite's BeforeSuite (its AfterSuite calls
// Stop). On an error, what it had started is stopped again.
func StartSuite(ctx context.Context, o SuiteOptions) (_ *Suite, err error) {
	if o.Log != nil {
		logf.SetLogger(zap.New(zap.WriteTo(o.Log), zap.UseDevMode(true)))
	}
	if o.Guarded == nil && o.Manager {
		return nil, errors.New("StartSuite: a manager needs an admission control plane (Guarded)")
	}
	s := &Suite{}
	defer func() {
		if err != nil {
			_ = s.Stop() // what was started
		}
	}()
	if o.Guarded != nil {
		if s.Admission, err = StartAdmissionEnv(ctx, o.Guarded, o.CRDDirs...); err != nil {
			return nil, err
		}
		s.Env, s.Config = s.Admission.Env, s.Admission.Admin
	} else {
		if s.Env, err = New(); err != nil {
			return nil, err
		}
		if o.ReplaceCRDs {
			s.Env.CRDDirectoryPaths = nil
		}
		s.Env.CRDDirectoryPaths = append(s.Env.CRDDirectoryPaths, o.CRDDirs...)
		if s.Config, err = s.Env.Start(); err != nil {
			return nil, err
		}
	}
	scheme := o.Scheme
	if scheme == nil {
		scheme = Scheme()
	}
	if s.Client, err = client.NewWithWatch(s.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if o.ClaimIdentity {
		var self authenticationv1.SelfSubjectReview
		if err = s.Client.Create(ctx, &self); err != nil {
			return nil, err
		}
		if _, err = InstallClaimIdentity(ctx, s.Config, self.Status.UserInfo.Username); err != nil {
			return nil, err
		}
	}
	if o.Manager {
		if s.Manager, err = s.Admission.StartManager(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Kubeconfig adds user (in group system:masters) to the control plane and
// writes a kubeconfig for it to dir/kubeconfig, whose path it returns.
func (s *Suite) Kubeconfig(user, dir string) (string, error) {
	u, err := s.Env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// Stop stops the manager StartSuite started, then the control plane.
func (s *Suite) Stop() error {
	var err error
	if s.Manager != nil {
		err = s.Manager.Stop()
		s.Manager = nil
	}
	if s.Env != nil {
		err = errors.Join(err, s.Env.Stop())
	}
	return err
}
