// Package helm tests the tensorcast Helm chart (deploy/helm/tensorcast)
// without a cluster: helm lint and helm template, and the rendered objects
// decoded strictly with the Kubernetes API types. It is a package of its
// own so that only its test binary links k8s.io/api; the daemon does not.
package helm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tensorcast/tensorcast/daemon/config"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

const (
	chartDir   = "tensorcast"
	allOptions = "testdata/all-options.yaml"
	// handoffOptions turns the hand-off on, without peers.
	handoffOptions = "testdata/handoff.yaml"
	// handoffPeersOptions turns it on with peers.
	handoffPeersOptions = "testdata/handoff-peers.yaml"
	engineFile          = "engine-pod.yaml"
	// rulesFile is the alert rules the PrometheusRule holds.
	rulesFile = "../prometheus/tensorcast-rules.yaml"
	// helmTool is where make deps (scripts/deps.sh) installs helm.
	helmTool = "../../bin/tools/helm"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// helm returns the helm binary make deps installs, else one on PATH;
// without either it skips, or fails where the machine says it has the
// tools make deps installs (testutil.Tools).
func helm(t *testing.T) string {
	t.Helper()
	if p, err := filepath.Abs(helmTool); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	testutil.Missing(t, testutil.Tools, "helm not at %s or on PATH (make deps installs it: go install helm.sh/helm/v3/cmd/helm, see scripts/deps.sh)", helmTool)
	return ""
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	// helm keeps caches and repository config under these; none is needed.
	dir := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir, "HELM_CONFIG_HOME="+dir, "HELM_DATA_HOME="+dir)
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// rendered is what helm template made of the chart for one values file.
type rendered struct {
	ds     *appsv1.DaemonSet
	cm     *corev1.ConfigMap
	secret *corev1.Secret
	pm     *podMonitor
	rule   *prometheusRule
	config map[string]any // the ConfigMap's tensorcastd.toml, decoded
}

// podMonitor is the part of the Prometheus Operator's PodMonitor the chart
// writes (monitoring.coreos.com/v1), decoded as strictly as the rest.
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port,omitempty"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				Regex        string   `json:"regex"`
				TargetLabel  string   `json:"targetLabel,omitempty"`
				Replacement  string   `json:"replacement,omitempty"`
				Action       string   `json:"action,omitempty"`
			} `json:"relabelings,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// prometheusRule is the Prometheus Operator's PrometheusRule
// (monitoring.coreos.com/v1), decoded as strictly as the rest.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleSpec `json:"spec"`
}

// ruleSpec is a rules file's content and a PrometheusRule's spec: its
// groups.
type ruleSpec struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert,omitempty"`
			Record      string            `json:"record,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// decodeStrict decodes one YAML document into v, failing on any field v's
// type does not have.
func decodeStrict(t *testing.T, doc []byte, v any) {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("rendered YAML: %v\n%s", err, doc)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding %T strictly: %v\n%s", v, err, doc)
	}
}

// render lints and templates the chart with values (none: the defaults)
// and decodes every object it renders.
func render(t *testing.T, values ...string) rendered {
	t.Helper()
	h := helm(t)
	var vals []string
	for _, v := range values {
		vals = append(vals, "--values", v)
	}
	if _, err := run(t, h, append([]string{"lint", chartDir, "--strict"}, vals...)...); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, h, append([]string{"template", "tc", chartDir, "--namespace", "tensorcast"}, vals...)...)
	if err != nil {
		t.Fatal(err)
	}
	var r rendered
	for _, doc := range strings.Split(out, "\n---") {
		doc = strings.TrimSpace(doc)
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind == "" {
			if strings.Trim(doc, "-\n ") == "" || strings.HasPrefix(doc, "#") && !strings.Contains(doc, "\nkind:") {
				continue
			}
			t.Fatalf("a rendered document without a kind (%v):\n%s", err, doc)
		}
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 DaemonSet":
			r.ds = new(appsv1.DaemonSet)
			decodeStrict(t, []byte(doc), r.ds)
		case "v1 ConfigMap":
			r.cm = new(corev1.ConfigMap)
			decodeStrict(t, []byte(doc), r.cm)
		case "v1 Secret":
			r.secret = new(corev1.Secret)
			decodeStrict(t, []byte(doc), r.secret)
		case "monitoring.coreos.com/v1 PodMonitor":
			r.pm = new(podMonitor)
			decodeStrict(t, []byte(doc), r.pm)
		case "monitoring.coreos.com/v1 PrometheusRule":
			r.rule = new(prometheusRule)
			decodeStrict(t, []byte(doc), r.rule)
		default:
			t.Fatalf("the chart rendered a %s %s the test does not check", meta.APIVersion, meta.Kind)
		}
	}
	if r.ds == nil || r.cm == nil {
		t.Fatalf("no DaemonSet or ConfigMap rendered:\n%s", out)
	}
	r.config = checkConfig(t, r.cm.Data["tensorcastd.toml"])
	return r
}

// checkConfig runs the daemon's own config check (tcctl config check) on
// the rendered config file and returns its keys.
func checkConfig(t *testing.T, text string) map[string]any {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tensorcastd.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	problems, err := config.CheckFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("rendered config: line %d: %s", pr.Line, pr)
	}
	var m map[string]any
	if _, err := toml.Decode(text, &m); err != nil {
		t.Fatalf("rendered config: %v\n%s", err, text)
	}
	if t.Failed() {
		t.Fatalf("rendered config:\n%s", text)
	}
	return m
}

func (r rendered) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := r.ds.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%d containers, want tensorcastd alone", len(cs))
	}
	return cs[0]
}

func (r rendered) hostPath(t *testing.T, volume string) string {
	t.Helper()
	for _, v := range r.ds.Spec.Template.Spec.Volumes {
		if v.Name == volume && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	t.Fatalf("no hostPath volume %s", volume)
	return ""
}

func mountPath(t *testing.T, c corev1.Container, volume string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	t.Fatalf("container %s does not mount %s", c.Name, volume)
	return ""
}

func capabilities(c corev1.Container) []string {
	var out []string
	if c.SecurityContext != nil && c.SecurityContext.Capabilities != nil {
		for _, c := range c.SecurityContext.Capabilities.Add {
			out = append(out, string(c))
		}
	}
	slices.Sort(out)
	return out
}

// TestChartDefaults: the default values render a daemon an engine pod can
// reach as the engine example does, with IPC_LOCK alone, no peers, and a
// config the daemon accepts.
func TestChartDefaults(t *testing.T) {
	r := render(t)
	c := r.container(t)
	if r.secret != nil || r.pm != nil || r.rule != nil {
		t.Error("defaults render a Secret, a PodMonitor or a PrometheusRule")
	}
	if got := capabilities(c); !slices.Equal(got, []string{"IPC_LOCK"}) {
		t.Errorf("capabilities %v, want IPC_LOCK alone with ebpf off", got)
	}
	if r.config["ebpf"] != "off" || r.config["rdma"] != "off" {
		t.Errorf("ebpf %v, rdma %v; want both off by default", r.config["ebpf"], r.config["rdma"])
	}
	if _, ok := r.config["peer_listen"]; ok {
		t.Error("peer_listen set with peers off")
	}
	for _, p := range c.Ports {
		if p.HostPort != 0 {
			t.Errorf("host port %d with peers off", p.HostPort)
		}
	}
	// pool 4Gi + 512Mi for the daemon, as memory without hugepages; no
	// hugepages, no RDMA device (peers use tcp).
	if q := c.Resources.Requests[corev1.ResourceMemory]; q.String() != "4608Mi" {
		t.Errorf("memory request %s, want 4608Mi", q.String())
	}
	for _, rl := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		for name := range rl {
			if strings.HasPrefix(string(name), "hugepages-") || strings.HasPrefix(string(name), "rdma/") {
				t.Errorf("resource %s by default", name)
			}
		}
	}
	// One daemon per GPU node: the GPU nodes' label and taint.
	spec := r.ds.Spec.Template.Spec
	if spec.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("node selector %v, want GPU nodes (nvidia.com/gpu.present=true)", spec.NodeSelector)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "nvidia.com/gpu" && tl.Operator == corev1.TolerationOpExists && tl.Effect == corev1.TaintEffectNoSchedule
	}) {
		t.Errorf("tolerations %v, want the GPU nodes' taint nvidia.com/gpu tolerated", spec.Tolerations)
	}
	// The daemon's uid and gid: the socket is created with its group.
	if sc := spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsGroup == nil || *sc.RunAsGroup != 2000 {
		t.Errorf("pod security context %+v, want the daemon's uid 0 and gid 2000", sc)
	}
	if r.config["socket_mode"] != "0660" {
		t.Errorf("socket_mode %v, want 0660 (the group may connect)", r.config["socket_mode"])
	}
	if r.config["pool_size"] != "4096MiB" {
		t.Errorf("pool_size %v, want 4096MiB", r.config["pool_size"])
	}

	// The engine example reaches the socket the chart renders.
	var engine corev1.Pod
	b, err := os.ReadFile(engineFile)
	if err != nil {
		t.Fatal(err)
	}
	decodeStrict(t, b, &engine)
	sock, _ := r.config["socket"].(string)
	if sock == "" || mountPath(t, c, "socket-dir") != path.Dir(sock) {
		t.Fatalf("socket %q is not in the mounted socket directory %s", sock, mountPath(t, c, "socket-dir"))
	}
	ec := engine.Spec.Containers[0]
	var envSock string
	for _, e := range ec.Env {
		if e.Name == "TENSORCAST_SOCKET" {
			envSock = e.Value
		}
	}
	if envSock != sock {
		t.Errorf("engine example's TENSORCAST_SOCKET %q, the daemon's socket %q", envSock, sock)
	}
	var engineHost string
	for _, v := range engine.Spec.Volumes {
		if v.HostPath != nil && v.Name == ec.VolumeMounts[0].Name {
			engineHost = v.HostPath.Path
		}
	}
	if host := r.hostPath(t, "socket-dir"); engineHost != host || mountPath(t, ec, ec.VolumeMounts[0].Name) != path.Dir(envSock) {
		t.Errorf("engine example mounts host %s at %s; the daemon's socket directory is host %s", engineHost, ec.VolumeMounts[0].MountPath, host)
	}
	// The engine runs with the daemon's group, which the socket has and
	// allowed_gids lists.
	gid := *r.ds.Spec.Template.Spec.SecurityContext.RunAsGroup
	if !slices.Contains(engine.Spec.SecurityContext.SupplementalGroups, gid) {
		t.Errorf("engine example's supplementalGroups %v lack the daemon's gid %d", engine.Spec.SecurityContext.SupplementalGroups, gid)
	}
	if gids, _ := r.config["allowed_gids"].([]any); !slices.Contains(gids, any(gid)) {
		t.Errorf("allowed_gids %v lack the daemon's gid %d", r.config["allowed_gids"], gid)
	}
	// The probes ask the daemon itself, on its socket.
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p == nil || p.Exec == nil || !slices.Contains(p.Exec.Command, sock) {
			t.Errorf("%s probe does not ask the daemon on %s: %+v", name, sock, p)
		}
	}
	if s := r.ds.Spec.UpdateStrategy; s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 1 || s.RollingUpdate.MaxSurge != nil {
		t.Errorf("update strategy %+v, want a rolling update of one node at a time, without surge", s)
	}
	if r.config["store_handoff"] != "off" {
		t.Errorf("store_handoff %v, want off by default", r.config["store_handoff"])
	}
}

// TestChartHandoff: with the hand-off on the new pod starts beside the old
// one (maxSurge 1, maxUnavailable 0), the daemon's store_handoff is on, the
// startup probe asks whether the daemon on the socket is the pod's own
// (tcctl ping --own: the old daemon may still answer there), and the
// socket directory both daemons meet in is the host's. Without peers the
// pods keep their own network.
func TestChartHandoff(t *testing.T) {
	r := render(t, handoffOptions)
	c := r.container(t)
	s := r.ds.Spec.UpdateStrategy
	if s.RollingUpdate == nil || s.RollingUpdate.MaxSurge == nil || s.RollingUpdate.MaxSurge.IntValue() != 1 ||
		s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("update strategy %+v, want maxSurge 1 and maxUnavailable 0", s.RollingUpdate)
	}
	if r.config["store_handoff"] != "on" {
		t.Errorf("store_handoff %v, want on", r.config["store_handoff"])
	}
	sock, _ := r.config["socket"].(string)
	if r.hostPath(t, "socket-dir") != "/run/tc" || mountPath(t, c, "socket-dir") != path.Dir(sock) {
		t.Errorf("the socket %s is not in the host's socket directory: both pods must meet there", sock)
	}
	checkOwnStartup(t, c, sock)
	if spec := r.ds.Spec.Template.Spec; spec.HostNetwork {
		t.Error("hostNetwork without peers: the pods need no port of the node")
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.Exec == nil || !slices.Contains(p.Exec.Command, sock) {
			t.Errorf("%s probe does not ask the daemon on %s: %+v", name, sock, p)
		}
	}
	for _, p := range c.Ports {
		if p.HostPort != 0 {
			t.Errorf("host port %d with the hand-off on", p.HostPort)
		}
	}
	h := helm(t)
	dir := t.TempDir()
	for _, tc := range []struct{ values, want string }{
		{"handoff:\n  enabled: true\nconfig:\n  store_handoff: \"on\"\n", "config.store_handoff is set by the chart"},
	} {
		f := filepath.Join(dir, "v.yaml")
		if err := os.WriteFile(f, []byte(tc.values), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run(t, h, "template", "tc", chartDir, "--values", f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q rendered: %v; want an error saying %q", tc.values, err, tc.want)
		}
	}

	// The first step of turning it on: the daemons offer the hand-off, the
	// update rolls as before (peers allowed), the probes ask the socket.
	first := filepath.Join(dir, "first.yaml")
	if err := os.WriteFile(first, []byte("handoff:\n  enabled: true\n  surge: false\npeers:\n  enabled: true\n  clusterKey: \"a shared key of the cluster, long enough\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = render(t, first)
	c = r.container(t)
	if s := r.ds.Spec.UpdateStrategy; s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 1 || s.RollingUpdate.MaxSurge != nil {
		t.Errorf("handoff without surge: update strategy %+v, want one node at a time without surge", s.RollingUpdate)
	}
	if r.config["store_handoff"] != "on" {
		t.Errorf("handoff without surge: store_handoff %v, want on", r.config["store_handoff"])
	}
	if c.StartupProbe == nil || c.StartupProbe.Exec == nil {
		t.Errorf("handoff without surge: startup probe %+v, want tcctl ping", c.StartupProbe)
	}
}

// checkOwnStartup: the startup probe runs tcctl ping --own on sock.
func checkOwnStartup(t *testing.T, c corev1.Container, sock string) {
	t.Helper()
	p := c.StartupProbe
	if p == nil || p.Exec == nil || p.HTTPGet != nil || !slices.Equal(p.Exec.Command, []string{"tcctl", "--socket", sock, "ping", "--own"}) {
		t.Errorf("startup probe %+v, want tcctl --socket %s ping --own (the pod's own daemon, not the old one on the socket)", p, sock)
	}
}

// TestChartHandoffPeers: the hand-off with peers rolls with maxSurge too.
// The pods run in the node's network namespace (the new daemon serves the
// peer listener the old one hands over, on the node's address) and
// declare no port: with hostNetwork every declared port is a host port,
// and the scheduler would not place the new pod beside the old one. The
// PodMonitor then finds the metrics port by relabeling, the peers are told
// the node's address, and the startup probe asks the pod's own daemon.
func TestChartHandoffPeers(t *testing.T) {
	r := render(t, handoffPeersOptions)
	c := r.container(t)
	spec := r.ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q; want the node's network and ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
	}
	for _, ctr := range append(spec.InitContainers, spec.Containers...) {
		if len(ctr.Ports) > 0 {
			t.Errorf("container %s declares ports %+v: with hostNetwork each is a host port that blocks the surge pod", ctr.Name, ctr.Ports)
		}
	}
	s := r.ds.Spec.UpdateStrategy
	if s.RollingUpdate == nil || s.RollingUpdate.MaxSurge == nil || s.RollingUpdate.MaxSurge.IntValue() != 1 ||
		s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("update strategy %+v, want maxSurge 1 and maxUnavailable 0", s.RollingUpdate)
	}
	if r.config["store_handoff"] != "on" || r.config["peer_listen"] != "0.0.0.0:7472" || r.config["rdma"] != "auto" {
		t.Errorf("store_handoff %v, peer_listen %v, rdma %v; want on, 0.0.0.0:7472, auto", r.config["store_handoff"], r.config["peer_listen"], r.config["rdma"])
	}
	advertise := ""
	for _, e := range c.Env {
		if e.Name == "TENSORCAST_PEER_ADVERTISE" {
			advertise = e.Value
		}
	}
	if advertise != "$(NODE_IP):7472" {
		t.Errorf("TENSORCAST_PEER_ADVERTISE %q, want the node's address on the peer port", advertise)
	}
	sock, _ := r.config["socket"].(string)
	checkOwnStartup(t, c, sock)
	if r.pm == nil || len(r.pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatal("no PodMonitor with one endpoint")
	}
	ep := r.pm.Spec.PodMetricsEndpoints[0]
	if ep.Port != "" {
		t.Errorf("PodMonitor endpoint names port %q, which no container declares", ep.Port)
	}
	addr := ""
	keeps := false
	for _, rl := range ep.Relabelings {
		if rl.TargetLabel == "__address__" && slices.Equal(rl.SourceLabels, []string{"__meta_kubernetes_pod_ip"}) {
			addr = rl.Replacement
		}
		keeps = keeps || rl.Action == "keep" && rl.Regex == c.Name
	}
	if addr != "$1:9501" || r.config["metrics_address"] != "0.0.0.0:9501" || !keeps {
		t.Errorf("PodMonitor relabels the address to %q (keeping container %s: %v), metrics_address %v; want the pod's IP on 9501",
			addr, c.Name, keeps, r.config["metrics_address"])
	}
}

// TestChartAllOptions: every option on renders capabilities, resources,
// the host port, the Secret, etcd, the PodMonitor and the PrometheusRule
// (the rules file's groups), and a config the daemon accepts, tenants
// included.
func TestChartAllOptions(t *testing.T) {
	r := render(t, allOptions)
	c := r.container(t)
	if got := capabilities(c); !slices.Equal(got, []string{"BPF", "IPC_LOCK", "PERFMON"}) {
		t.Errorf("capabilities %v, want BPF, IPC_LOCK, PERFMON with ebpf on", got)
	}
	if r.config["ebpf"] != "auto" || r.config["rdma"] != "auto" || r.config["directory"] != "etcd" {
		t.Errorf("ebpf %v, rdma %v, directory %v", r.config["ebpf"], r.config["rdma"], r.config["directory"])
	}
	for res, want := range map[corev1.ResourceName]string{
		"hugepages-2Mi": "8Gi", corev1.ResourceMemory: "1Gi", "rdma/rdma_shared_device_a": "1", corev1.ResourceCPU: "4",
	} {
		if q, ok := c.Resources.Limits[res]; !ok || q.String() != want {
			t.Errorf("limit %s = %s, want %s", res, q.String(), want)
		}
		// Kubernetes wants hugepages and extended resources requested
		// as they are limited.
		if q := c.Resources.Requests[res]; res != corev1.ResourceCPU && q.String() != want {
			t.Errorf("request %s = %s, want %s as its limit", res, q.String(), want)
		}
	}
	if eps, _ := r.config["etcd_endpoints"].([]any); len(eps) != 3 || eps[0] != "https://etcd-0.etcd:2379" || r.config["etcd_prefix"] != "/tc/" {
		t.Errorf("etcd_endpoints %v, etcd_prefix %v; want the values' three endpoints and /tc/", r.config["etcd_endpoints"], r.config["etcd_prefix"])
	}
	var peerPort int32
	for _, p := range c.Ports {
		if p.Name == "peer" {
			peerPort = p.HostPort
		}
	}
	if peerPort != 7471 || r.config["peer_listen"] != "0.0.0.0:7471" {
		t.Errorf("peer host port %d, peer_listen %v; want 7471", peerPort, r.config["peer_listen"])
	}
	if r.secret == nil || r.secret.StringData["cluster.key"] == "" {
		t.Fatal("no cluster key Secret")
	}
	keyDir := mountPath(t, c, "cluster-key")
	if r.config["cluster_key_file"] != keyDir+"/cluster.key" {
		t.Errorf("cluster_key_file %v, the key is mounted at %s", r.config["cluster_key_file"], keyDir)
	}
	for _, v := range r.ds.Spec.Template.Spec.Volumes {
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o077 != 0) {
			t.Errorf("secret volume %s is readable by group or others; the daemon refuses such a key", v.Name)
		}
	}
	etcdDir := mountPath(t, c, "etcd-tls")
	for _, k := range []string{"etcd_ca_file", "etcd_cert_file", "etcd_key_file"} {
		if f, _ := r.config[k].(string); path.Dir(f) != etcdDir {
			t.Errorf("%s = %q, not under the etcd TLS mount %s", k, f, etcdDir)
		}
	}
	if tenants, _ := r.config["tenants"].([]map[string]any); len(tenants) != 2 {
		t.Errorf("tenants %v, want the two of the values", r.config["tenants"])
	}
	if _, ok := r.config["allowed_gids"]; ok {
		t.Error("allowed_gids set beside [[tenants]]")
	}
	if r.pm == nil || len(r.pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatal("no PodMonitor with one endpoint")
	}
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == r.pm.Spec.PodMetricsEndpoints[0].Port {
			metricsPort = p.ContainerPort
		}
	}
	if metricsPort != 9500 || r.config["metrics_address"] != "0.0.0.0:9500" {
		t.Errorf("PodMonitor port is container port %d, metrics_address %v; want 9500", metricsPort, r.config["metrics_address"])
	}
	sel := r.pm.Spec.Selector.MatchLabels
	for k, v := range sel {
		if r.ds.Spec.Template.Labels[k] != v {
			t.Errorf("PodMonitor selects %s=%s, the pods are labelled %q", k, v, r.ds.Spec.Template.Labels[k])
		}
	}
	// The PrometheusRule holds the rules file's groups, as they are.
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var want ruleSpec
	decodeStrict(t, b, &want)
	if r.rule == nil || len(want.Groups) == 0 || !reflect.DeepEqual(r.rule.Spec, want) {
		t.Errorf("the PrometheusRule's spec is not the rules of %s:\n%+v", rulesFile, r.rule)
	}
	if r.rule != nil && r.rule.Labels["release"] != "prometheus" {
		t.Errorf("PrometheusRule labels %v, want monitoring.prometheusRule.labels among them", r.rule.Labels)
	}
}

// TestChartRefuses: a key the chart sets may not be repeated under config,
// a grace period must cover the drain, and a key the daemon does not know
// is refused by its config check.
func TestChartRefuses(t *testing.T) {
	h := helm(t)
	dir := t.TempDir()
	owned := filepath.Join(dir, "owned.yaml")
	if err := os.WriteFile(owned, []byte("config:\n  socket: /tmp/x.sock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, h, "template", "tc", chartDir, "--values", owned); err == nil || !strings.Contains(err.Error(), "config.socket is set by the chart") {
		t.Errorf("config.socket rendered: %v", err)
	}

	// The kubelet must wait for the drain: a grace period shorter than
	// drain_timeout and the second the daemon takes to close is refused,
	// and so is a drain_timeout the chart cannot read to check it.
	// drain_timeout is read as the daemon reads it, any Go duration,
	// rounded up to whole seconds.
	for _, tc := range []struct{ values, want string }{
		{"terminationGracePeriodSeconds: 30\nconfig:\n  drain_timeout: 1m30s\n", "make it at least 91"},
		{"terminationGracePeriodSeconds: 30\nconfig:\n  drain_timeout: 1m30.5s\n", "make it at least 92"},
		{"terminationGracePeriodSeconds: 30\nconfig:\n  drain_timeout: 30500ms\n", "make it at least 32"},
		{"terminationGracePeriodSeconds: 30\nconfig:\n  drain_timeout: 0.5h\n", "make it at least 1801"},
		{"terminationGracePeriodSeconds: 30\nconfig:\n  drain_timeout: 29000001us\n", "make it at least 31"},
		{"config:\n  drain_timeout: \"10\"\n", `config.drain_timeout "10": give it as a Go duration`},
		{"config:\n  drain_timeout: 10 s\n", `config.drain_timeout "10 s": give it as a Go duration`},
		{"config:\n  drain_timeout: 1d\n", `config.drain_timeout "1d": give it as a Go duration`},
	} {
		p := filepath.Join(dir, "drain.yaml")
		if err := os.WriteFile(p, []byte(tc.values), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run(t, h, "template", "tc", chartDir, "--values", p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q rendered: %v; want an error saying %q", tc.values, err, tc.want)
		}
	}

	// Those a grace period of 30 covers render, and the daemon reads
	// them alike.
	for _, d := range []string{"29s", "1500ms", "1.5s", "29000000us", "28999999999ns", "28s999ms", ".4m", "3000ms"} {
		p := filepath.Join(dir, "drain-ok.yaml")
		if err := os.WriteFile(p, []byte("terminationGracePeriodSeconds: 30\nconfig:\n  drain_timeout: "+d+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run(t, h, "template", "tc", chartDir, "--values", p); err != nil {
			t.Errorf("drain_timeout %s with a grace period of 30: %v", d, err)
		}
	}
	// The grace period is drain_timeout rounded up, and a second.
	for _, tc := range []struct {
		drain string
		min   int
	}{{"3000ms", 4}, {"1.1m", 67}, {"2h45m", 9901}, {"1ns", 2}} {
		p := filepath.Join(dir, "drain-min.yaml")
		if err := os.WriteFile(p, []byte(fmt.Sprintf("terminationGracePeriodSeconds: %d\nconfig:\n  drain_timeout: %s\n", tc.min, tc.drain)), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run(t, h, "template", "tc", chartDir, "--values", p); err != nil {
			t.Errorf("drain_timeout %s with a grace period of %d: %v", tc.drain, tc.min, err)
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("terminationGracePeriodSeconds: %d\nconfig:\n  drain_timeout: %s\n", tc.min-1, tc.drain)), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run(t, h, "template", "tc", chartDir, "--values", p); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("make it at least %d", tc.min)) {
			t.Errorf("drain_timeout %s with a grace period of %d rendered: %v", tc.drain, tc.min-1, err)
		}
	}

	unknown := filepath.Join(dir, "unknown.yaml")
	if err := os.WriteFile(unknown, []byte("config:\n  pool_sise: 1GiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, h, "template", "tc", chartDir, "--values", unknown, "--show-only", "templates/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	decodeStrict(t, []byte(out), &cm)
	p := filepath.Join(dir, "tensorcastd.toml")
	if err := os.WriteFile(p, []byte(cm.Data["tensorcastd.toml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	problems, err := config.CheckFile(p)
	if err != nil || len(problems) != 1 || problems[0].Key != "pool_sise" {
		t.Errorf("config check of an unknown key: %v %v", problems, err)
	}
}

// daemonKeys returns every top-level key of the daemon's config file (the
// toml tags of config.Config, its embedded key groups included) with the
// field's type.
func daemonKeys(t reflect.Type) map[string]reflect.Type {
	keys := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			maps.Copy(keys, daemonKeys(f.Type))
			continue
		}
		if tag := f.Tag.Get("toml"); tag != "" && tag != "-" && f.IsExported() {
			keys[tag] = f.Type
		}
	}
	return keys
}

// chartKeys are the daemon's keys the chart sets from its own values (the
// pod's layout), and how: each is set in the all-options render (the
// first) or comes from the pod's environment (the second). Every other
// key passes through config: untouched.
var chartKeys = map[string]string{
	"socket":           "socketDir",
	"data_dir":         "dataDir",
	"pool_size":        "pool.size",
	"metrics_address":  "metrics.port",
	"peer_listen":      "peers.port",
	"cluster_key_file": "peers.existingSecret or peers.clusterKey",
	"directory":        "etcd.enabled",
	"etcd_endpoints":   "etcd.endpoints",
	"etcd_prefix":      "etcd.prefix",
	"etcd_ca_file":     "etcd.tlsSecret",
	"etcd_cert_file":   "etcd.tlsSecret",
	"etcd_key_file":    "etcd.tlsSecret",
	"ebpf":             "ebpf.enabled",
	"rdma":             "rdma.enabled",
	"store_handoff":    "handoff.enabled",
	"daemon_id":        "env TENSORCAST_DAEMON_ID",
	"peer_advertise":   "env TENSORCAST_PEER_ADVERTISE",
}

// tableSamples are valid entries of the daemon's lists of tables, one key
// each of the entry's type: TestChartReachesEveryConfigKey fails when the
// daemon's entry type gains a key that is not here.
var tableSamples = map[string]map[string]any{
	"tenants": {"name": "team-c", "uids": []any{4001}, "gids": []any{4000}, "pool_size": "1GiB", "allowed_files": []any{"/mnt/nvme2"}},
	"peers":   {"id": "node-b", "addr": "10.0.0.2:7471"},
}

// sampleValue is a valid value of key for a values file: its default,
// written as the config file writes it (sizes and durations as their
// text, modes in octal).
func sampleValue(t *testing.T, key string, def reflect.Value) any {
	t.Helper()
	switch v := def.Interface().(type) {
	case config.FileMode:
		return fmt.Sprintf("%04o", uint32(v))
	case fmt.Stringer:
		return v.String()
	}
	switch def.Kind() {
	case reflect.String, reflect.Bool:
		return def.Interface()
	case reflect.Int, reflect.Int64, reflect.Uint32, reflect.Uint64:
		return def.Convert(reflect.TypeFor[int64]()).Interface()
	case reflect.Float64:
		return def.Float()
	case reflect.Slice:
		out := []any{}
		for i := range def.Len() {
			out = append(out, sampleValue(t, key, def.Index(i)))
		}
		if len(out) == 0 {
			// An empty list says nothing: one element of the type.
			switch def.Type().Elem().Kind() {
			case reflect.String:
				out = append(out, "/mnt/sample")
			case reflect.Uint32:
				// An id of its own per key: allowed and denied differ.
				out = append(out, int64(4000+len(key)))
			default:
				t.Fatalf("config key %s: no sample for a list of %s", key, def.Type().Elem())
			}
		}
		return out
	}
	t.Fatalf("config key %s: no sample for a %s; teach sampleValue", key, def.Type())
	return nil
}

// sameValue compares a value written into the values with what the
// rendered config file holds for it, after YAML, helm and TOML (numbers
// become float64 in helm and int64 in TOML). A list must hold every
// element given: the chart adds to some (allowed_gids gets daemon.gid).
func sameValue(want, got any) bool {
	w, g := normalize(want), normalize(got)
	if wl, ok := w.([]any); ok {
		gl, ok := g.([]any)
		if !ok {
			return false
		}
		for _, e := range wl {
			if !slices.ContainsFunc(gl, func(x any) bool { return fmt.Sprint(x) == fmt.Sprint(e) }) {
				return false
			}
		}
		return true
	}
	return fmt.Sprint(w) == fmt.Sprint(g)
}

func normalize(v any) any {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case int:
		return float64(x)
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normalize(x[i])
		}
		return out
	case []map[string]any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normalize(x[i])
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	}
	return v
}

// TestChartReachesEveryConfigKey: every key of the daemon's config
// (enumerated from config.Config, so a key added to the daemon is
// checked without touching this test) reaches the rendered config file:
// either the chart sets it from its values (chartKeys, rendered with every
// option on) or from the pod's environment, or it passes through config:
// with the value given, the lists of tables ([[tenants]], [[peers]]) with
// every key of their entries; and the daemon's check accepts the result.
func TestChartReachesEveryConfigKey(t *testing.T) {
	keys := daemonKeys(reflect.TypeFor[config.Config]())
	if len(keys) < 50 {
		t.Fatalf("only %d keys found in config.Config", len(keys))
	}
	for k := range chartKeys {
		if _, ok := keys[k]; !ok {
			t.Errorf("chartKeys names %s, which is not a key of the daemon", k)
		}
	}

	// The chart's own keys: set with every option on, or from the
	// environment.
	all := render(t, allOptions)
	env := map[string]bool{}
	for _, e := range all.container(t).Env {
		env[e.Name] = true
	}
	for k, how := range chartKeys {
		if name, ok := strings.CutPrefix(how, "env "); ok {
			if !env[name] {
				t.Errorf("%s: the chart should set it from the environment (%s), and does not", k, name)
			}
			continue
		}
		if _, ok := all.config[k]; !ok {
			t.Errorf("%s: not in the config rendered with every option on (it should come from %s)", k, how)
		}
	}

	// The chart's keys may not be repeated under config: (the chart
	// would silently win), and its README names each.
	h := helm(t)
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	owned := filepath.Join(t.TempDir(), "owned.yaml")
	for k := range chartKeys {
		if !strings.Contains(string(readme), "`"+k+"`") && !(strings.HasPrefix(k, "etcd_") && strings.Contains(string(readme), "`etcd_*`")) {
			t.Errorf("the chart's README does not name %s among the keys the chart sets", k)
		}
		if err := os.WriteFile(owned, []byte("config:\n  "+k+": x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run(t, h, "template", "tc", chartDir, "--values", owned); err == nil || !strings.Contains(err.Error(), "config."+k+" is set by the chart") {
			t.Errorf("config.%s rendered beside the chart's own: %v", k, err)
		}
	}

	// Every other key through config:, each with a valid value: its
	// default, which the daemon's check accepts.
	defs := reflect.ValueOf(config.Defaults())
	sample := map[string]any{}
	for k := range keys {
		if _, owned := chartKeys[k]; owned {
			continue
		}
		if sub, ok := tableSamples[k]; ok {
			entry := keys[k].Elem()
			if entry.Kind() != reflect.Struct {
				t.Fatalf("config key %s: a list of %s, not of tables", k, entry)
			}
			for ek := range daemonKeys(entry) {
				if _, ok := sub[ek]; !ok {
					t.Errorf("[[%s]] has a key %s that tableSamples lacks: add a valid value for it", k, ek)
				}
			}
			continue // rendered beside the peers of all-options, below
		}
		sample[k] = sampleValue(t, k, fieldByTag(defs, k))
	}
	if t.Failed() {
		return
	}
	dir := t.TempDir()
	writeValues := func(name string, v map[string]any) string {
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := func(r rendered, want map[string]any) {
		t.Helper()
		for k, v := range want {
			got, ok := r.config[k]
			if !ok {
				t.Errorf("config.%s = %v does not reach the rendered config", k, v)
				continue
			}
			if !sameValue(v, got) {
				t.Errorf("config.%s = %v renders as %v", k, v, got)
			}
		}
	}
	r := render(t, writeValues("every-key.yaml", map[string]any{"config": sample}))
	check(r, sample)

	// The lists of tables need peers (and no allowed_gids beside
	// tenants): on top of every option.
	tables := map[string]any{}
	for k, s := range tableSamples {
		tables[k] = []any{s}
	}
	r = render(t, allOptions, writeValues("tables.yaml", map[string]any{"config": tables}))
	check(r, tables)
}

// fieldByTag is the field of the config struct v tagged toml:"key",
// looking into its embedded key groups.
func fieldByTag(v reflect.Value, key string) reflect.Value {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if fv := fieldByTag(v.Field(i), key); fv.IsValid() {
				return fv
			}
			continue
		}
		if f.Tag.Get("toml") == key {
			return v.Field(i)
		}
	}
	return reflect.Value{}
}

// TestChartTenantPools: with [[tenants]] the pods request the pools the
// daemon makes, one per tenant (its pool_size, else pool.size), and a
// tenant's pool_size the chart cannot read is refused.
func TestChartTenantPools(t *testing.T) {
	dir := t.TempDir()
	values := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tenants := `pool:
  size: 2Gi
config:
  tenants:
    - name: a
      gids: [3000]
      pool_size: 3GiB
    - name: b
      gids: [3001]
    - name: c
      gids: [3002]
      pool_size: 512m
    - name: d
      gids: [3003]
      pool_size: 8388608
`
	// 3072 + 2048 (pool.size) + 512 + 8 MiB of pools, and 512Mi for the daemon.
	r := render(t, values("tenants.yaml", tenants))
	c := r.container(t)
	if q := c.Resources.Requests[corev1.ResourceMemory]; q.String() != "6152Mi" {
		t.Errorf("memory request %s with the tenants' pools, want 6152Mi", q.String())
	}
	r = render(t, values("tenants", tenants), values("hugepages.yaml", "hugepages:\n  enabled: true\n"))
	c = r.container(t)
	if q := c.Resources.Limits["hugepages-2Mi"]; q.String() != "5640Mi" {
		t.Errorf("hugepages-2Mi %s with the tenants' pools, want 5640Mi", q.String())
	}
	h := helm(t)
	bad := values("bad.yaml", "config:\n  tenants:\n    - name: a\n      gids: [3000]\n      pool_size: 3 GB\n")
	if _, err := run(t, h, "template", "tc", chartDir, "--values", bad); err == nil || !strings.Contains(err.Error(), `config.tenants a pool_size "3 GB"`) {
		t.Errorf("a tenant's pool_size of 3 GB rendered: %v", err)
	}
}
