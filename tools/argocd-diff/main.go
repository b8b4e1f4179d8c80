// Command argocd-diff answers, with Argo CD's own code, whether Argo CD reports one resource Synced
// or OutOfSync, and what a sync with RespectIgnoreDifferences=true would apply. `argocd-diff deletion`
// answers which objects deleting an Application, or pruning, would delete (deletion.go).
//
//   - Settings: the resource overrides, instance label key, tracking method and compare options come
//     from Argo CD's SettingsManager reading an argocd-cm ConfigMap (held by a fake clientset), as
//     the application controller's getComparisonSettings reads them.
//   - Tracking: with "app", argo.NewResourceTracking().SetAppInstance marks config as the repo
//     server marks the manifests it renders.
//   - Diff: argodiff.StateDiff with the DiffConfig CompareAppState (controller/state.go) builds:
//     WithDiffSettings(app.Spec.IgnoreDifferences, resourceOverrides, IgnoreAggregatedRoles, ...),
//     WithTracking(appLabelKey, trackingMethod), WithNoCache(), WithManager(ArgoCDSSAManager), and
//     Argo CD's default client-side (three-way) diff: no server-side diff, no ServerSideApply.
//   - Sync: controller.normalizeTargetResources (controller/sync.go), the step SyncAppState runs
//     for RespectIgnoreDifferences=true; _overlay/ exports it at build time (build.sh).
//
// Input on stdin, one JSON object:
//
//	{"config": {...},            the manifest from Git
//	 "live": {...},              the object as the API server returns it
//	 "ignoreDifferences": [...], Application.spec.ignoreDifferences
//	 "argocdCM": {...},          argocd-cm's data (optional; none means Argo CD's defaults)
//	 "app": {"name": ..., "destinationNamespace": ...}}   (optional)
//
// Output on stdout, one JSON object: "sync" ("Synced" or "OutOfSync": CompareAppState's rule for a
// resource both in Git and in the cluster, OutOfSync exactly when the diff is Modified), "modified",
// "normalizedLive" and "predictedLive" (the two sides Argo CD's diff view shows), "config" (config
// with its tracking metadata) and "respectIgnoreDifferencesTarget" (what a sync with
// RespectIgnoreDifferences=true applies: config with the live values of the ignored fields).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/controller"
	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/argo"
	argodiff "github.com/argoproj/argo-cd/v3/util/argo/diff"
	"github.com/argoproj/argo-cd/v3/util/argo/normalizers"
	"github.com/argoproj/argo-cd/v3/util/settings"
	log "github.com/sirupsen/logrus"
)

type input struct {
	Config            map[string]any                       `json:"config"`
	Live              map[string]any                       `json:"live"`
	IgnoreDifferences []v1alpha1.ResourceIgnoreDifferences `json:"ignoreDifferences"`
	ArgoCDCM          map[string]string                    `json:"argocdCM"`
	App               *application                         `json:"app"`
}

// application names the Argo CD Application the resource belongs to; with it, config gets the
// tracking label or annotation, as the repo server adds it to the manifests it renders.
type application struct {
	Name                 string `json:"name"`
	DestinationNamespace string `json:"destinationNamespace"`
}

type output struct {
	// The config as compared (and as a sync applies it): with the tracking metadata when app is given.
	Config         map[string]any  `json:"config"`
	Modified       bool            `json:"modified"`
	Sync           string          `json:"sync"`
	NormalizedLive json.RawMessage `json:"normalizedLive"`
	PredictedLive  json.RawMessage `json:"predictedLive"`
	// What a sync with RespectIgnoreDifferences=true applies: the config with the live values of the ignored fields.
	RespectIgnoreDifferencesTarget map[string]any `json:"respectIgnoreDifferencesTarget"`
}

func main() {
	// Argo CD logs through logrus, to stdout; the answer goes there, so its logs go to stderr.
	log.SetOutput(os.Stderr)
	command := run
	if len(os.Args) == 2 && os.Args[1] == "deletion" {
		command = runDeletion // deletion.go
	} else if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: argocd-diff [deletion] < request.json")
		os.Exit(2)
	}
	if err := command(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "argocd-diff:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var req input
	dec := json.NewDecoder(in)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if req.Config == nil || req.Live == nil {
		return fmt.Errorf("the request needs both config and live")
	}

	const namespace = "argocd"
	partOf := map[string]string{"app.kubernetes.io/part-of": "argocd"}
	clientset := fake.NewClientset(
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDConfigMapName, Namespace: namespace, Labels: partOf},
			Data:       req.ArgoCDCM,
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDSecretName, Namespace: namespace, Labels: partOf},
			Data:       map[string][]byte{},
		},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr := settings.NewSettingsManager(ctx, clientset, namespace)

	// What CompareAppState reads: getComparisonSettings, then GetResourceCompareOptions.
	overrides, err := mgr.GetResourceOverrides()
	if err != nil {
		return fmt.Errorf("resource overrides: %w", err)
	}
	appLabelKey, err := mgr.GetAppInstanceLabelKey()
	if err != nil {
		return fmt.Errorf("instance label key: %w", err)
	}
	trackingMethod, err := mgr.GetTrackingMethod()
	if err != nil {
		return fmt.Errorf("tracking method: %w", err)
	}
	compareOptions, err := mgr.GetResourceCompareOptions()
	if err != nil {
		compareOptions = settings.GetDefaultDiffOptions()
	}

	diffConfig, err := argodiff.NewDiffConfigBuilder().
		WithDiffSettings(req.IgnoreDifferences, overrides, compareOptions.IgnoreAggregatedRoles, normalizers.IgnoreNormalizerOpts{}).
		WithTracking(appLabelKey, trackingMethod).
		WithNoCache().
		WithManager(common.ArgoCDSSAManager).
		WithServerSideDiff(false).
		Build()
	if err != nil {
		return fmt.Errorf("diff config: %w", err)
	}

	live := &unstructured.Unstructured{Object: req.Live}
	config := &unstructured.Unstructured{Object: req.Config}
	if req.App != nil {
		installationID, err := mgr.GetInstallationID()
		if err != nil {
			return fmt.Errorf("installation ID: %w", err)
		}
		err = argo.NewResourceTracking().SetAppInstance(config, appLabelKey, req.App.Name,
			req.App.DestinationNamespace, v1alpha1.TrackingMethod(trackingMethod), installationID)
		if err != nil {
			return fmt.Errorf("tracking: %w", err)
		}
	}
	result, err := argodiff.StateDiff(live, config, diffConfig)
	if err != nil {
		return err
	}
	res := output{
		Config:         config.Object,
		Modified:       result.Modified,
		Sync:           string(v1alpha1.SyncStatusCodeSynced),
		NormalizedLive: result.NormalizedLive,
		PredictedLive:  result.PredictedLive,
	}
	if result.Modified {
		res.Sync = string(v1alpha1.SyncStatusCodeOutOfSync)
	}
	targets, err := controller.KVOffloadRespectIgnoreDifferences(
		[]*unstructured.Unstructured{live}, []*unstructured.Unstructured{config}, diffConfig)
	if err != nil {
		return fmt.Errorf("RespectIgnoreDifferences: %w", err)
	}
	res.RespectIgnoreDifferencesTarget = targets[0].Object

	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
