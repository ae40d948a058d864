package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketOptions configure the announcement bucket. DefaultBucketOptions has the defaults.
type BucketOptions struct {
	Bucket string        // the key-value bucket's name; DefaultBucket
	Lease  time.Duration // its TTL: an entry not refreshed for this long expires; DefaultLease
	// Storage: file (the default) keeps announcements across a NATS restart, so nobody's lease
	// is cut short by one.
	Storage  jetstream.StorageType
	Replicas int // copies in a JetStream cluster; 1
}

// DefaultBucketOptions: DefaultBucket, a DefaultLease lease, file storage, one replica.
func DefaultBucketOptions() BucketOptions {
	return BucketOptions{Bucket: DefaultBucket, Lease: DefaultLease, Storage: jetstream.FileStorage, Replicas: 1}
}

// Bucket is an open announcement bucket and what it was created with.
type Bucket struct {
	KV    jetstream.KeyValue
	Lease time.Duration // the bucket's TTL, whoever created it
	// Markers says whether the server leaves a delete marker when an entry's TTL runs out
	// (KeyValueConfig.LimitMarkerTTL, nats-server 2.11+), which watchers see as a purge. Without
	// them an expiry is silent and a Watcher finds it with its own clock.
	Markers bool
}

// OpenBucket opens the bucket, creating it when it is missing. The first process to start
// creates it and sets the lease; the others use the bucket as it is (its TTL is Bucket.Lease),
// so every announcer's heartbeat follows the lease of the bucket they share, whatever its own
// flag said. On servers without per-message TTLs (before 2.11) the bucket is made without
// delete markers.
func OpenBucket(ctx context.Context, js jetstream.JetStream, o BucketOptions) (*Bucket, error) {
	if o.Lease < MinLease {
		return nil, fmt.Errorf("fleet bucket %s: lease %v, at least %v", o.Bucket, o.Lease, MinLease)
	}
	kv, err := js.KeyValue(ctx, o.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cfg := jetstream.KeyValueConfig{Bucket: o.Bucket, Description: "dataplane workers: announcements with a lease",
			History: 1, TTL: o.Lease, MaxValueSize: MaxValueBytes, Storage: o.Storage, Replicas: max(o.Replicas, 1),
			LimitMarkerTTL: o.Lease}
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
			cfg.LimitMarkerTTL = 0
			kv, err = js.CreateKeyValue(ctx, cfg)
		}
		if errors.Is(err, jetstream.ErrBucketExists) { // another process created it meanwhile
			kv, err = js.KeyValue(ctx, o.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fleet bucket %s: %w", o.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet bucket %s: %w", o.Bucket, err)
	}
	if st.TTL() < MinLease {
		return nil, fmt.Errorf("fleet bucket %s has a TTL of %v: not a lease (at least %v); delete it or name another bucket", o.Bucket, st.TTL(), MinLease)
	}
	return &Bucket{KV: kv, Lease: st.TTL(), Markers: st.LimitMarkerTTL() > 0}, nil
}

// gone says whether err means the bucket (its stream) is not there any more, e.g. after a NATS
// server restarted without its state: open it again.
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}
