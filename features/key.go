package features

import (
	"strings"
	"time"
)

// Key identifies reusable features. Two items share an entry only when every field is equal,
// so two tenants never see each other's entries unless they were given the same salt.
type Key struct {
	Salt       string // the tenant's cache salt ("" is a salt like any other)
	Content    string // content hash of the media (e.g. hex blake3, vLLM's mm_hash) or a client uuid
	Model      string // the encoder (and projector) that produced the features
	Preprocess string // canonical preprocessing parameters: size, crop, fps, ...
}

// maxKeyField bounds each key field, so the cache index stays small per entry.
const maxKeyField = 1024

func (k Key) validate() error {
	switch {
	case k.Content == "":
		return invalidf("key has no content hash")
	case k.Model == "":
		return invalidf("key has no model id")
	}
	for _, f := range [...]string{k.Salt, k.Content, k.Model, k.Preprocess} {
		if len(f) > maxKeyField {
			return invalidf("key field of %d bytes (at most %d)", len(f), maxKeyField)
		}
	}
	return nil
}

// PolicyKind says what happens to a request's features after prefill.
type PolicyKind uint8

const (
	// DiscardAfterPrefill frees the features once the LLM worker has prefilled (the default).
	DiscardAfterPrefill PolicyKind = iota
	// KeepForReuse caches them for TTL after prefill, for the next turn of a conversation.
	KeepForReuse
	// KeepUntilDone holds them until generation completes (beam search, speculative decoding).
	KeepUntilDone
)

// Policy is a request's cache policy. The zero value is DiscardAfterPrefill.
type Policy struct {
	Kind PolicyKind
	TTL  time.Duration // KeepForReuse only: how long an idle entry stays
}

const (
	// DefaultKeepTTL is the TTL of "keep" without one.
	DefaultKeepTTL = 5 * time.Minute
	// MaxKeepTTL bounds a TTL, so a client cannot pin memory for days.
	MaxKeepTTL = 24 * time.Hour
)

func (p Policy) validate() error {
	switch p.Kind {
	case DiscardAfterPrefill, KeepUntilDone:
		if p.TTL != 0 {
			return invalidf("policy %v takes no TTL", p)
		}
	case KeepForReuse:
		if p.TTL <= 0 || p.TTL > MaxKeepTTL {
			return invalidf("keep TTL %v outside (0, %v]", p.TTL, MaxKeepTTL)
		}
	default:
		return invalidf("unknown policy kind %d", p.Kind)
	}
	return nil
}

// String writes the form ParsePolicy reads: "discard", "keep:5m0s", "until-done".
func (p Policy) String() string {
	switch p.Kind {
	case DiscardAfterPrefill:
		return "discard"
	case KeepForReuse:
		return "keep:" + p.TTL.String()
	case KeepUntilDone:
		return "until-done"
	}
	return "policy(?)"
}

// ParsePolicy reads a policy as a request gives it: "" or "discard"; "keep" (DefaultKeepTTL)
// or "keep:<duration>" (Go syntax, e.g. "keep:90s"); "until-done".
func ParsePolicy(s string) (Policy, error) {
	name, ttl, hasTTL := strings.Cut(s, ":")
	var p Policy
	switch name {
	case "", "discard":
		p.Kind = DiscardAfterPrefill
	case "until-done":
		p.Kind = KeepUntilDone
	case "keep":
		p = Policy{Kind: KeepForReuse, TTL: DefaultKeepTTL}
		if hasTTL {
			d, err := time.ParseDuration(ttl)
			if err != nil {
				return Policy{}, invalidf("cache policy %q: TTL: %v", s, err)
			}
			p.TTL = d
		}
	default:
		return Policy{}, invalidf("cache policy %q: want discard, keep[:TTL] or until-done", s)
	}
	if hasTTL && p.Kind != KeepForReuse {
		return Policy{}, invalidf("cache policy %q: only keep takes a TTL", s)
	}
	if err := p.validate(); err != nil {
		return Policy{}, invalidf("cache policy %q: TTL %v outside (0, %v]", s, p.TTL, MaxKeepTTL)
	}
	return p, nil
}
