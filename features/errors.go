package features

import (
	"errors"
	"fmt"
	"time"
)

// The kinds of failure; every error this package returns unwraps to one of them.
var (
	ErrIllegalTransition = errors.New("illegal state transition")
	ErrBudget            = errors.New("memory budget exhausted")
	ErrNoDevice          = errors.New("no device staging memory on this node")
	ErrClosed            = errors.New("closed")
	ErrNotHeld           = errors.New("record not held by this request")
	ErrEncodeFailed      = errors.New("encoding failed")
	ErrAbandoned         = errors.New("no request wants the item any more")
	ErrOverEstimate      = errors.New("features larger than the reservation")
	ErrInvalid           = errors.New("invalid argument")
	ErrInUse             = errors.New("memory still held")
)

// TransitionError is an illegal step: nothing was changed.
type TransitionError struct {
	Op       string // the method called
	Record   uint64 // the record's id
	MediaID  string
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("features: %s: item %q (record %d) is %v for this request, cannot become %v", e.Op, e.MediaID, e.Record, e.From, e.To)
}

func (e *TransitionError) Unwrap() error { return ErrIllegalTransition }

// Rejection says why an allocation was refused.
type Rejection uint8

const (
	RejectQueueFull Rejection = iota // too many admissions already waiting for this pool
	RejectTimeout                    // memory did not come free before the deadline
	RejectTooLarge                   // larger than the whole pool: it can never fit
	numRejections
)

var rejectionNames = [numRejections]string{"queue_full", "timeout", "too_large"}

func (r Rejection) String() string {
	if r < numRejections {
		return rejectionNames[r]
	}
	return fmt.Sprintf("Rejection(%d)", uint8(r))
}

// BudgetError is an allocation the budget refused after evicting idle cached entries and
// waiting. Reason says whether waiting could help; RetryAfter, when > 0, how long to wait.
type BudgetError struct {
	Pool       string // "host" or "device"
	Reason     Rejection
	Need       int64 // bytes asked for
	Free       int64 // bytes free when refused (some may be too fragmented to use)
	Capacity   int64
	RetryAfter time.Duration // 0 for RejectTooLarge: retrying cannot help
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("features: %s pool: %v: need %d bytes, %d of %d free", e.Pool, e.Reason, e.Need, e.Free, e.Capacity)
}

func (e *BudgetError) Unwrap() error { return ErrBudget }

// EncodeError is what holders of a record whose encoding failed see.
type EncodeError struct {
	Record  uint64
	MediaID string
	Cause   error
}

func (e *EncodeError) Error() string {
	return fmt.Sprintf("features: item %q (record %d): encoding failed: %v", e.MediaID, e.Record, e.Cause)
}

func (e *EncodeError) Unwrap() []error { return []error{ErrEncodeFailed, e.Cause} }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("features: %w: "+format, append([]any{ErrInvalid}, args...)...)
}
