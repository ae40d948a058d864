package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"dataplane/bench/ab"
	"dataplane/router"
	"dataplane/router/fleet"
	"dataplane/router/kvevents"
	"dataplane/router/topology"
)

// Topology and disaggregated routing, as commands take them (router/disagg.go has the rules):
// the worker side reads its domains from files and announces them (mock, relay, serve); the
// router side (router, serve) takes the level, the mismatch policy and the soft cost's QoS
// table, and a static fleet file. Dynamo's environment variables set the same flags
// (envAliases).

// workerTopology is the worker side's flags.
type workerTopology struct {
	enabled     bool
	dir, level  string
	wait        time.Duration
	flagsLabels string // --labels, key=value,...
}

// workerTopologyFlags declares --labels and the topology files' flags.
func workerTopologyFlags(fs *flag.FlagSet, t *workerTopology) {
	fs.StringVar(&t.flagsLabels, "labels", "", "labels announced, key=value,... (topology: zone=...,rack=...)")
	fs.BoolVar(&t.enabled, "topology", false, "read this worker's topology domains from --topology-dir and announce them as labels ($DYN_TOPOLOGY_ENABLED)")
	fs.StringVar(&t.dir, "topology-dir", topology.DefaultDir, "directory of topology files: each file a level, its content the domain ($DYN_TOPOLOGY_MOUNT_PATH)")
	fs.StringVar(&t.level, "topology-level", "zone", "the level whose file must be there: the process waits --topology-wait for it, then exits ($DYN_TOPOLOGY_DOMAIN)")
	fs.DurationVar(&t.wait, "topology-wait", topology.DefaultWait, "how long to wait for --topology-level's file")
}

// labels are the labels to announce: --labels, and with --topology the domains read from the
// files (polled once a second until the level's is there, else an error: the command exits).
// A level given both ways with different values is an error.
func (t *workerTopology) labels(ctx context.Context, log *slog.Logger) (map[string]string, error) {
	labels, err := parseLabels(t.flagsLabels)
	if err != nil {
		return nil, fmt.Errorf("--labels: %w", err)
	}
	if !t.enabled {
		return labels, nil
	}
	domains, err := topology.ReadDomains(ctx, t.dir, t.level, t.wait, topology.DefaultPoll)
	if err != nil {
		return nil, err
	}
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range domains {
		if old, ok := labels[k]; ok && old != v {
			return nil, fmt.Errorf("topology: --labels says %s=%s, %s/%s says %s", k, old, t.dir, k, v)
		}
		labels[k] = v
	}
	w := fleet.Worker{Name: "x", Role: fleet.Aggregated, Labels: labels}
	if err := w.Check(); err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	log.Info("topology", "dir", t.dir, "level", t.level, "domains", domains)
	return labels, nil
}

// routerTopology is the router side's flags; resolve puts them into router.DisaggOptions.
type routerTopology struct {
	policy, qos  string
	workerLabels string // --worker-labels: a static fleet file
	static       []fleet.Worker
}

func routerTopologyFlags(fs *flag.FlagSet, o *router.DisaggOptions, t *routerTopology) {
	fs.StringVar(&o.Level, "kv-transfer-topology-level", "", "keep KV transfers within this topology level: decode workers in the prefill worker's domain (zone, rack; \"\": no filtering) ($DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL)")
	fs.StringVar(&t.policy, "kv-transfer-mismatch-policy", string(topology.Fail), "no decode worker in the prefill worker's domain: fail (an error naming the domain) or fallback (any decode worker, with a warning) ($DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY)")
	fs.StringVar(&t.qos, "kv-transfer-qos", "", "the soft transfer cost's per-level links, broadest first: zone=2ms@5GB/s,rack=200us@25GB/s,local=20us@50GB/s, or @FILE (JSON); \"\": none")
	fs.Float64Var(&o.TransferWeight, "kv-transfer-weight", o.TransferWeight, "weight of the KV transfer time (in blocks of prefill time) against decode blocks")
	fs.Float64Var(&o.KVBytesPerToken, "kv-bytes-per-token", o.KVBytesPerToken, "the model's KV cache bytes per token: 2 × layers × KV heads × head size × dtype bytes")
	fs.StringVar(&t.workerLabels, "worker-labels", "", "a static fleet: JSON list of {name, endpoint, role, topology: {zone, rack}}; routable at once, without KV events (overlap 0 until events arrive)")
}

// resolve parses the policy, the QoS table and the static fleet file.
func (t *routerTopology) resolve(o *router.DisaggOptions) error {
	p, err := topology.ParsePolicy(t.policy)
	if err != nil {
		return fmt.Errorf("--kv-transfer-mismatch-policy: %w", err)
	}
	o.Policy = p
	switch q := strings.TrimSpace(t.qos); {
	case strings.HasPrefix(q, "@"):
		raw, err := os.ReadFile(q[1:])
		if err != nil {
			return fmt.Errorf("--kv-transfer-qos: %w", err)
		}
		if o.QoS, err = topology.ParseQoSJSON(raw); err != nil {
			return fmt.Errorf("--kv-transfer-qos %s: %w", q[1:], err)
		}
	case q != "":
		if o.QoS, err = topology.ParseQoS(q); err != nil {
			return fmt.Errorf("--kv-transfer-qos: %w", err)
		}
	}
	if !o.QoS.Empty() && !(o.KVBytesPerToken > 0) {
		return fmt.Errorf("--kv-bytes-per-token %v: the soft transfer cost needs the KV size", o.KVBytesPerToken)
	}
	if t.workerLabels != "" {
		raw, err := os.ReadFile(t.workerLabels)
		if err != nil {
			return fmt.Errorf("--worker-labels: %w", err)
		}
		if t.static, err = fleet.ParseStatic(raw); err != nil {
			return fmt.Errorf("--worker-labels %s: %w", t.workerLabels, err)
		}
	}
	return nil
}

// workerInfo is what the router keeps of an announcement or a static entry.
func workerInfo(w fleet.Worker) router.WorkerInfo {
	role := router.RoleAggregated
	switch w.Role {
	case fleet.Prefill:
		role = router.RolePrefill
	case fleet.Decode:
		role = router.RoleDecode
	}
	return router.WorkerInfo{Role: role, Labels: maps.Clone(w.Labels)}
}

// addStaticWorkers registers a static fleet with the standalone router (through the stream
// feed, when it also follows one): routable at once, with their roles and labels; a worker the
// --kv-events list already registered (same name) only gets them.
func addStaticWorkers(sf *kvevents.StreamFeed, ws []fleet.Worker, log *slog.Logger) error {
	r := sf.Feed().Router()
	for _, w := range ws {
		if !knownWorker(r, w.Name) {
			if _, err := sf.AddWorker(w.Name); err != nil {
				return fmt.Errorf("--worker-labels: %s: %w", w.Name, err)
			}
		}
		if err := r.SetWorkerInfo(w.Name, workerInfo(w)); err != nil {
			return err
		}
		if w.KVBlocks > 0 {
			if err := sf.Feed().SetCapacity(w.Name, w.KVBlocks); err != nil {
				return err
			}
		}
		log.Info("worker", "name", w.Name, "role", w.Role, "endpoint", w.Endpoint, "labels", w.Labels, "source", "--worker-labels")
	}
	return nil
}

func knownWorker(r *router.Router, name string) bool {
	for _, n := range r.Workers() {
		if n == name {
			return true
		}
	}
	return false
}

// abTopology is bench ab's flags for the disaggregated policies.
type abTopology struct{ qos, policy string }

func abTopologyFlags(fs *flag.FlagSet, o *ab.Options, t *abTopology) {
	fs.IntVar(&o.Prefill, "prefill", 0, "disaggregated policies: prefill engines")
	fs.IntVar(&o.Decode, "decode", 0, "disaggregated policies: decode engines")
	fs.IntVar(&o.Layout.Zones, "zones", 0, "lay each role's engines over this many zones (engine i in zone-(i mod N))")
	fs.IntVar(&o.Layout.Racks, "racks", 0, "and over this many racks per zone")
	fs.StringVar(&t.qos, "kv-transfer-qos", "", "the KV cache's move between engines, per level: zone=1ms@5GB/s,local=100us@50GB/s (or @FILE); the soft policies' router knows the same table")
	fs.Float64Var(&o.Transfer.BytesPerToken, "kv-bytes-per-token", o.Transfer.BytesPerToken, "the KV cache's bytes per token (Llama-3-8B bf16: 131072)")
	fs.Float64Var(&o.TransferWeight, "kv-transfer-weight", o.TransferWeight, "the soft policies' weight of the move against decode blocks")
	fs.StringVar(&t.policy, "kv-transfer-mismatch-policy", string(o.MismatchPolicy), "the topology policies' fail or fallback")
}

func (t *abTopology) resolve(o *ab.Options) error {
	var rt routerTopology
	rt.qos, rt.policy = t.qos, t.policy
	d := router.DisaggOptions{KVBytesPerToken: o.Transfer.BytesPerToken}
	if err := rt.resolve(&d); err != nil {
		return err
	}
	o.Transfer.QoS, o.MismatchPolicy = d.QoS, d.Policy
	return nil
}

// printDisagg is bench ab's table of the disaggregated runs' KV moves.
func printDisagg(w io.Writer, res []ab.Result) error {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	header := false
	for _, r := range res {
		if !strings.HasPrefix(r.Policy, "disagg") {
			continue
		}
		if !header {
			fmt.Fprintln(w)
			fmt.Fprintln(tw, "policy\tKV move p50\tKV move p99\tcrossed zones\t")
			header = true
		}
		fmt.Fprintf(tw, "%s\t%.1f ms\t%.1f ms\t%.2f\t\n", r.Policy, r.KVMove.P50, r.KVMove.P99, r.Crossed)
	}
	return tw.Flush()
}

// synthFleet writes a static disaggregated fleet (a --worker-labels file): prefill and decode
// workers laid over zones and racks as bench ab and dataplane mock --zones lay them.
func synthFleet(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("synth fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var layout topology.Layout
	prefill := fs.Int("prefill", 0, "prefill workers")
	decode := fs.Int("decode", 0, "decode workers")
	aggregated := fs.Int("aggregated", 0, "aggregated workers")
	fs.IntVar(&layout.Zones, "zones", 1, "zones: worker i of a role in zone-(i mod N)")
	fs.IntVar(&layout.Racks, "racks", 0, "racks per zone (0: no rack label)")
	endpoints := map[string]*string{
		"prefill":    fs.String("prefill-endpoint", "http://127.0.0.1:8200/engines/{i}", "prefill worker i's base URL ({i}: its index)"),
		"decode":     fs.String("decode-endpoint", "http://127.0.0.1:8300/engines/{i}", "decode worker i's base URL"),
		"aggregated": fs.String("aggregated-endpoint", "http://127.0.0.1:8400/engines/{i}", "aggregated worker i's base URL"),
	}
	names := map[string]*string{
		"prefill":    fs.String("prefill-name", "prefill-{i}", "prefill worker i's name (its KV events' worker name, e.g. mock --name-prefix's)"),
		"decode":     fs.String("decode-name", "decode-{i}", "decode worker i's name"),
		"aggregated": fs.String("aggregated-name", "aggregated-{i}", "aggregated worker i's name"),
	}
	out := fs.String("out", "", "where to write it (default: stdout)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	n := *prefill + *decode + *aggregated
	if fs.NArg() > 0 || *prefill < 0 || *decode < 0 || *aggregated < 0 || n == 0 || n > fleet.MaxStaticWorkers || layout.Zones < 1 || layout.Racks < 0 {
		fmt.Fprintf(stderr, "synth fleet: want --prefill, --decode, --aggregated >= 0 (1 to %d in all), --zones >= 1, --racks >= 0\n", fleet.MaxStaticWorkers)
		return errUsage
	}
	type entry struct {
		Name     string            `json:"name"`
		Endpoint string            `json:"endpoint"`
		Role     string            `json:"role"`
		Topology map[string]string `json:"topology,omitempty"`
	}
	var entries []entry
	for _, r := range []struct {
		role  string
		count int
	}{{"prefill", *prefill}, {"decode", *decode}, {"aggregated", *aggregated}} {
		for i := range r.count {
			idx := strconv.Itoa(i)
			entries = append(entries, entry{Name: strings.ReplaceAll(*names[r.role], "{i}", idx), Role: r.role,
				Endpoint: strings.ReplaceAll(*endpoints[r.role], "{i}", idx), Topology: layout.Labels(i)})
		}
	}
	raw, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return err
	}
	if _, err := fleet.ParseStatic(raw); err != nil { // what serve and router will read
		fmt.Fprintf(stderr, "synth fleet: %v\n", err)
		return errUsage
	}
	raw = append(raw, '\n')
	if *out == "" {
		_, err = stdout.Write(raw)
		return err
	}
	return os.WriteFile(*out, raw, 0o644)
}
