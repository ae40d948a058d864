package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sort"
	"sync"
	"time"

	"dataplane/dataplane"
	"dataplane/dataplane/remote"
	"dataplane/router/fleet"
	"dataplane/transfer/wire"

	"github.com/prometheus/client_golang/prometheus"
)

// offerEncoders serves this daemon's encoders to the fleet over the transfer protocol on
// --transfer-listen (default: --listen's host, any port) and returns the address to announce
// (tcp://, with --advertise's host when given) and the stop. Features go back compressed
// with compress (--transfer-compress).
func offerEncoders(svc *dataplane.Service, reg prometheus.Registerer, listen, httpAddr, advertise string, compress wire.Compress, log *slog.Logger) (string, func(), error) {
	if listen == "" {
		host, _, err := net.SplitHostPort(httpAddr)
		if err != nil {
			return "", nil, err
		}
		listen = net.JoinHostPort(host, "0")
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return "", nil, fmt.Errorf("--transfer-listen: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if advertise != "" {
		if u, err := url.Parse(advertise); err == nil && u.Hostname() != "" {
			host = u.Hostname()
		}
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1" // a wildcard listener: announce loopback unless --advertise names a host
	}
	srv := remote.NewServer(svc.PeerBackend(), remote.ServerOptions{Budget: svc.Memory(), Wire: wire.Options{Compress: compress}})
	if err := reg.Register(srv.Collector()); err != nil {
		ln.Close()
		return "", nil, err
	}
	done := make(chan struct{})
	go func() { // owned: ends with Close below
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, wire.ErrServerClosed) {
			log.Error("transfer listener", "err", err)
		}
	}()
	addr := "tcp://" + net.JoinHostPort(host, port)
	log.Info("remote encoding: offering this daemon's encoders", "transfer", addr)
	return addr, func() { srv.Close(); <-done }, nil //nolint:errcheck // Close always succeeds
}

// encoderModels is what the daemon announces it encodes, at its calibrated costs.
func encoderModels(svc *dataplane.Service) []fleet.EncoderModel {
	costs := svc.EncoderCosts()
	mods := make([]string, 0, len(costs))
	for m := range costs {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	out := make([]fleet.EncoderModel, 0, len(mods))
	for _, m := range mods {
		out = append(out, fleet.EncoderModel{Model: svc.Models().Name, Modality: m, SecondsPerToken: costs[m]})
	}
	return out
}

// catalogHandler feeds a remote.Catalog from the fleet's announcements.
type catalogHandler struct {
	cat *remote.Catalog
	log *slog.Logger
}

func (h catalogHandler) Join(w fleet.Worker) {
	if h.cat.Join(w) {
		h.log.Info("remote encoder joined", "name", w.Name, "transfer", w.Transfer, "labels", w.Labels)
	}
}
func (h catalogHandler) Update(w fleet.Worker)  { h.cat.Join(w) } // its costs recalibrate
func (h catalogHandler) Leave(name, why string) { h.cat.Leave(name) }

// useRemoteEncoders watches the fleet's encoders (announcements and load reports) and lets the
// service send items to them; this daemon reports its own encode queue for the others. The
// returned function stops it all.
func useRemoteEncoders(ctx context.Context, svc *dataplane.Service, n *natsClient, sf *serveFlags, self string, labels map[string]string, log *slog.Logger) (func(), error) {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	b, err := fleet.OpenBucket(octx, n.js, sf.nats.bucket)
	cancel()
	if err != nil {
		return nil, err
	}
	cat := remote.NewCatalog(self)
	client := remote.NewClient(remote.ClientOptions{Wire: wire.Options{Compress: sf.transferCompress}})
	ctx, stopAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() { stopAll(); wg.Wait(); client.Close() }
	w := fleet.NewWatcher(b, n.nc, catalogHandler{cat, log})
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	var stats fleet.LoadStats
	sub, err := fleet.SubscribeLoad(n.nc, sf.nats.load, &stats, cat.Report)
	if err != nil {
		stop()
		return nil, err
	}
	pub := fleet.NewLoadPublisher(n.nc, sf.nats.load, func() []fleet.WorkerLoad {
		return []fleet.WorkerLoad{{Name: self, Load: fleet.Load{Running: -1, Waiting: -1, ActiveBlocks: -1, PrefillTokens: -1, KVBlocks: -1,
			EncodeSeconds: svc.EncodeQueue().Seconds()}}}
	})
	wg.Add(2)
	go func() { defer wg.Done(); <-ctx.Done(); _ = sub.Unsubscribe() }()
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()
	svc.SetRemote(dataplane.RemoteOptions{Client: client, Catalog: cat, Labels: labels, QoS: svc.RouterQoS()})
	log.Info("remote encoding: sending items to the fleet's encoders when they would be done first", "bucket", b.KV.Bucket())
	return stop, nil
}
