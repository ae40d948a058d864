package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"dataplane/router/fleet"
	"dataplane/router/kvevents"
)

// NATS for `router`, `serve`, `mock`, `relay` and `bench fleet`: either a server of our own,
// in-process, with JetStream (--nats embedded, the default of router and serve), or an
// existing server or cluster (--nats nats://a:4222,nats://b:4222) with the client's
// credentials and TLS options. On it: the KV-event stream (router/kvevents: jetstream.go), the
// announcement bucket and the load subjects (router/fleet).

// natsConfig is what the --nats* flags set.
type natsConfig struct {
	url      string // "embedded", "none", or comma-separated server URLs
	listen   string // the embedded server's HOST:PORT
	stateDir string // the embedded server's JetStream store ("": defaultStateDir)
	maxMem   int64  // the embedded server's JetStream memory limit
	maxStore int64  // and its storage limit
	// The client's credentials and TLS, as nats.go offers them.
	creds, nkey, tlsCA, tlsCert, tlsKey string

	stream kvevents.StreamOptions
	bucket fleet.BucketOptions
	load   string // load subject prefix
}

// natsFlags declares the connection, embedded-server, stream and bucket flags; def is the
// command's --nats default.
func natsFlags(fs *flag.FlagSet, c *natsConfig, def string) {
	c.stream, c.bucket = kvevents.DefaultStreamOptions(), fleet.DefaultBucketOptions()
	c.maxMem, c.maxStore = 256<<20, 4<<30
	fs.StringVar(&c.url, "nats", def, `NATS: "embedded" (a server in this process, with JetStream), "none", or server URLs nats://host:4222,... (a cluster)`)
	fs.StringVar(&c.listen, "nats-listen", "127.0.0.1:4222", "HOST:PORT of the embedded NATS server (port 0: any free one)")
	fs.StringVar(&c.stateDir, "state-dir", "", "the embedded NATS server's JetStream store (default: $XDG_CACHE_HOME/dataplane/nats, or ~/.cache/..., or a temp dir)")
	fs.Var(bytesVar(&c.maxMem), "nats-max-memory", "the embedded server's JetStream memory limit")
	fs.Var(bytesVar(&c.maxStore), "nats-max-store", "the embedded server's JetStream storage limit (at least --kv-max-bytes and the bucket)")
	fs.StringVar(&c.creds, "nats-creds", "", "NATS credentials file (a user JWT and its nkey seed)")
	fs.StringVar(&c.nkey, "nats-nkey", "", "NATS nkey seed file")
	fs.StringVar(&c.tlsCA, "nats-tls-ca", "", "CA certificates (PEM) to verify the NATS servers with")
	fs.StringVar(&c.tlsCert, "nats-tls-cert", "", "client certificate (PEM) for NATS TLS")
	fs.StringVar(&c.tlsKey, "nats-tls-key", "", "its key (PEM)")
	fs.StringVar(&c.stream.Name, "kv-stream", c.stream.Name, "the JetStream stream of KV events")
	fs.StringVar(&c.stream.Prefix, "nats-prefix", c.stream.Prefix, "KV-event subject prefix: events for worker W are on PREFIX.W")
	fs.DurationVar(&c.stream.MaxAge, "kv-max-age", c.stream.MaxAge, "the KV-event stream keeps batches this long")
	fs.Var(bytesVar(&c.stream.MaxBytes), "kv-max-bytes", "and at most this much of them (the oldest go first)")
	fs.StringVar(&c.bucket.Bucket, "fleet-bucket", c.bucket.Bucket, "the JetStream key-value bucket where workers are announced")
	fs.DurationVar(&c.bucket.Lease, "lease", c.bucket.Lease, "a worker not heard of for this long leaves (the bucket's TTL, set by whoever creates it; heartbeats every lease/3)")
	fs.StringVar(&c.load, "load-prefix", fleet.DefaultLoadPrefix, "load subject prefix: worker W reports its load on PREFIX.W")
}

// check validates the flags; errors name the flag.
func (c *natsConfig) check() error {
	switch {
	case c.url == "":
		return errors.New(`--nats: empty (want "embedded", "none" or nats://host:port,...)`)
	case c.url != "embedded" && c.url != "none":
		for _, u := range strings.Split(c.url, ",") {
			u = strings.TrimSpace(u)
			if !strings.Contains(u, "://") {
				return fmt.Errorf("--nats: %q is not a URL (nats://host:port, tls://host:port)", u)
			}
		}
	}
	switch {
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return errors.New("--nats-tls-cert and --nats-tls-key go together")
	case c.creds != "" && c.nkey != "":
		return errors.New("--nats-creds and --nats-nkey: give one")
	case c.bucket.Lease < fleet.MinLease:
		return fmt.Errorf("--lease %v: at least %v", c.bucket.Lease, fleet.MinLease)
	case c.stream.MaxAge <= 0 || c.stream.MaxBytes <= 0:
		return fmt.Errorf("--kv-max-age %v and --kv-max-bytes %d must be positive", c.stream.MaxAge, c.stream.MaxBytes)
	case strings.ContainsAny(c.stream.Prefix, " *>") || strings.ContainsAny(c.load, " *>") || c.stream.Prefix == "" || c.load == "":
		return fmt.Errorf("--nats-prefix %q, --load-prefix %q: want NATS subject tokens without wildcards", c.stream.Prefix, c.load)
	case c.url == "embedded" && c.maxStore < c.stream.MaxBytes+(64<<20):
		return fmt.Errorf("--nats-max-store %d cannot hold --kv-max-bytes %d and the bucket", c.maxStore, c.stream.MaxBytes)
	}
	return nil
}

// natsClient is a connection with JetStream, and the embedded server when there is one.
type natsClient struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	url string // what the client connected to
	srv *server.Server
	dir *os.File // the state directory's lock, held while the embedded server runs
}

// connectNATS starts the embedded server when asked and connects to it or to the given
// servers, reconnecting for ever (every 250 ms, with jitter) and buffering up to 64 MiB of
// publishes meanwhile. name tells the servers who the client is.
func connectNATS(c *natsConfig, name string, log *slog.Logger) (*natsClient, error) {
	n := &natsClient{url: c.url}
	if c.url == "embedded" {
		if err := n.startEmbedded(c, log); err != nil {
			return nil, err
		}
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second), nats.ReconnectBufSize(64 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("nats", "subject", subject, "err", err)
		}),
	}
	if c.creds != "" {
		opts = append(opts, nats.UserCredentials(c.creds))
	}
	if c.nkey != "" {
		o, err := nats.NkeyOptionFromSeed(c.nkey)
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("--nats-nkey: %w", err)
		}
		opts = append(opts, o)
	}
	if c.tlsCA != "" {
		opts = append(opts, nats.RootCAs(c.tlsCA))
	}
	if c.tlsCert != "" {
		opts = append(opts, nats.ClientCert(c.tlsCert, c.tlsKey))
	}
	nc, err := nats.Connect(n.url, opts...)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("nats %s: %w", n.url, err)
	}
	n.nc = nc
	if n.js, err = jetstream.New(nc); err != nil {
		n.Close()
		return nil, fmt.Errorf("nats %s: %w", n.url, err)
	}
	return n, nil
}

// Close closes the connection, then stops the embedded server and releases its directory.
func (n *natsClient) Close() {
	if n.nc != nil {
		n.nc.Close()
	}
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
	if n.dir != nil {
		n.dir.Close() // and with it the lock
	}
}

// defaultStateDir is where the embedded server keeps its JetStream store when --state-dir is
// not given: under the user's cache directory (it is state that can be rebuilt: the events
// again from the engines, the announcements from the next heartbeats), else a temp directory.
func defaultStateDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "dataplane", "nats")
	}
	return filepath.Join(os.TempDir(), "dataplane-"+strconv.Itoa(os.Getuid()), "nats")
}

// startEmbedded runs the embedded server with JetStream under the state directory, which it
// locks first (two servers on one store would corrupt it).
func (n *natsClient) startEmbedded(c *natsConfig, log *slog.Logger) error {
	dir := c.stateDir
	if dir == "" {
		dir = defaultStateDir()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return fmt.Errorf("--state-dir %s is in use by another process's embedded NATS server: join it with --nats nats://HOST:PORT, or give this one another --state-dir", dir)
	}
	n.dir = lock
	host, portStr, err := net.SplitHostPort(c.listen)
	if err != nil {
		return fmt.Errorf("--nats-listen %q: %w", c.listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--nats-listen: port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else if ln, err := net.Listen("tcp", c.listen); err != nil { // the server would only say so in its log
		return fmt.Errorf("embedded nats on %s: %w (another dataplane's? join it with --nats nats://%s)", c.listen, err, c.listen)
	} else {
		ln.Close()
	}
	srv, err := server.NewServer(&server.Options{ServerName: "dataplane-embedded", Host: host, Port: port, NoLog: true, NoSigs: true,
		MaxPayload: 8 << 20, JetStream: true, StoreDir: dir, JetStreamMaxMemory: c.maxMem, JetStreamMaxStore: c.maxStore})
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("embedded nats on %s: not ready after 10s", c.listen)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return fmt.Errorf("embedded nats: JetStream did not start (state dir %s)", dir)
	}
	n.srv, n.url = srv, srv.ClientURL()
	log.Info("embedded nats", "url", n.url, "state_dir", dir, "jetstream_max_memory", c.maxMem, "jetstream_max_store", c.maxStore)
	return nil
}

// ensureStream creates or updates the KV-event stream, within a few seconds.
func (n *natsClient) ensureStream(ctx context.Context, o kvevents.StreamOptions) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := kvevents.EnsureStream(ctx, n.js, o)
	return err
}
