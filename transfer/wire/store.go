package wire

import (
	"context"
	"errors"
	"fmt"

	"dataplane/features"
)

// ReceiveInto reads the current frame's payload into an encoding job's buffer (memory the
// receiving daemon admitted against its own feature budget) and settles the job: Complete with
// the payload's length, or Fail on a checksum mismatch or a short buffer. This is how features
// encoded elsewhere land in the requester's store: the job came from its own Admit when it
// decided to encode remotely.
func ReceiveInto(ctx context.Context, c *Conn, h *Header, job *features.Job) error {
	err := receive(ctx, c, h, job)
	if err != nil {
		if ferr := job.Fail(err); ferr != nil {
			return errors.Join(err, ferr)
		}
		return err
	}
	return job.Complete(h.Len)
}

func receive(ctx context.Context, c *Conn, h *Header, job *features.Job) error {
	if h.Kind != KindFeatures {
		c.Discard(ctx)
		if rerr := h.Err(); rerr != nil {
			return rerr
		}
		return fmt.Errorf("wire: frame %d is %v, not features", h.RequestID, h.Kind)
	}
	buf := job.Buffer().Bytes()
	if int64(len(buf)) < h.Len {
		c.Discard(ctx)
		return fmt.Errorf("wire: frame %d: %d bytes of features for a reservation of %d", h.RequestID, h.Len, len(buf))
	}
	return c.ReadPayload(ctx, buf)
}

// Admit admits the current KindFeatures frame's item into req under the frame's key, then
// reads the payload into the new record's buffer (ReceiveInto). An item the store already
// holds is a hit: the payload is skipped. A refusal (*features.BudgetError and the like)
// skips the payload too and is returned, so the stream stays usable and the caller can answer
// with an error frame; nothing stays reserved.
func Admit(ctx context.Context, c *Conn, h *Header, req *features.Request, mediaID string) (*features.Record, error) {
	if h.Kind != KindFeatures {
		return nil, fmt.Errorf("wire: frame %d is %v, not features", h.RequestID, h.Kind)
	}
	rec, job, err := req.Admit(ctx, features.Item{Key: h.Key, MediaID: mediaID, Bytes: h.Len})
	if err != nil {
		if derr := c.Discard(ctx); derr != nil {
			return nil, errors.Join(err, derr)
		}
		return nil, err
	}
	if job == nil {
		return rec, c.Discard(ctx)
	}
	if err := ReceiveInto(ctx, c, h, job); err != nil {
		return nil, err
	}
	return rec, nil
}
