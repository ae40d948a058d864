package dataplane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/media"
	"dataplane/dataplane/media/admit"
	"dataplane/dataplane/media/fetch"
	"dataplane/dataplane/memory"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/sequence"
	"dataplane/features"
	"dataplane/native"
)

// item is one media item of a request on its way to features: where it is in the request,
// what it becomes (the encoder inputs and their token counts), and its cache key.
type item struct {
	src      *openai.Media
	modality sequence.Modality
	model    *encoder.Model
	inputs   []encoder.Input // nil for an item known only by its uuid
	rows     []int           // feature rows per input
	tokens   int             // all rows
	key      features.Key
	id       string // the identifier engines and the router hash: the client's uuid, else the content key
	detail   string

	rec *features.Record
	job *features.Job
	// held: admitted as a miss and not yet sent to an encoder (remote encoding routes first).
	held bool
}

// itemError is a failure to prepare an item: the item's bytes or content are unusable (its
// chain keeps the fetch error, the memory refusal or the context error, if any, which says
// more, and those decide the status).
func itemError(m *openai.Media, err error) *Error {
	var me *memory.Error
	if errors.As(err, &me) || errors.Is(err, context.Canceled) {
		return &Error{Param: m.Path, Err: err}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Param: m.Path, Kind: ErrTimeout, Err: err}
	}
	return &Error{Param: m.Path, Kind: ErrInvalid, Err: err}
}

// source is an item's bytes, read before it takes a CPU slot: inline data, a data: URL
// decoded, a fetch, or a video's pictures; rels give back their admissions (release).
type source struct {
	data   []byte
	frames [][]byte
	rels   []func()
}

func (src *source) release() {
	for _, r := range src.rels {
		r()
	}
	src.rels = nil
}

// admitter reserves on acct, within ctx, for the media package's and the fetcher's hooks.
func admitter(ctx context.Context, acct *memory.Account) admit.Func {
	if acct == nil {
		return nil
	}
	return func(n int64) (func(), error) {
		if err := acct.Reserve(ctx, n, ""); err != nil {
			return nil, err
		}
		return func() { acct.Release(n) }, nil
	}
}

// read gets an item's bytes (none for an item known only by its uuid). Fetches run in their
// own bounded pool (s.fetchSem): a slow media server holds a fetch slot, never a CPU slot.
func (s *Service) read(ctx context.Context, m *openai.Media, acct *memory.Account) (*source, error) {
	src := &source{}
	take := admitter(ctx, acct)
	one := func(url string) ([]byte, func(), error) {
		if strings.HasPrefix(url, "data:") {
			// The decoded copy: a data: URL's bytes are 3/4 of its base64.
			rel, err := take.Take("data: URL", int64(len(url))/4*3)
			if err != nil {
				return nil, nil, err
			}
			d, err := media.ParseDataURL(url, int(s.opts.MaxMediaBytes))
			if err != nil {
				rel()
				return nil, nil, err
			}
			return d.Data, rel, nil
		}
		select {
		case s.fetchSem <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		defer func() { <-s.fetchSem }()
		return s.fetcher.FetchAdmitted(ctx, url, take)
	}
	switch {
	case m.Frames != nil:
		for i, u := range m.Frames {
			b, rel, err := one(u)
			if err != nil {
				src.release()
				return nil, itemError(m, fmt.Errorf("picture %d: %w", i, err))
			}
			src.rels = append(src.rels, rel)
			src.frames = append(src.frames, b)
		}
	case m.Data != nil:
		if int64(len(m.Data)) > s.opts.MaxMediaBytes {
			return nil, itemError(m, fmt.Errorf("%w: %d bytes, the limit is %d (--max-media-bytes)", fetch.ErrTooLarge, len(m.Data), s.opts.MaxMediaBytes))
		}
		src.data = m.Data
	case m.URL != "":
		b, rel, err := one(m.URL)
		if err != nil {
			return nil, itemError(m, err)
		}
		src.rels = append(src.rels, rel)
		src.data = b
	}
	return src, nil
}

// prepare turns one media part into an item: the preset's preprocessing of its bytes, the
// encoder inputs, the exact token count and the cache key. An item given only by a uuid is
// resolved through the uuid table (it must still be cached). Decoding admits its memory on
// acct; the encoder inputs it keeps stay admitted until the request ends.
func (s *Service) prepare(ctx context.Context, m *openai.Media, src *source, salt string, acct *memory.Account) (*item, error) {
	return s.prepareWith(ctx, m, src, salt, s.opts.Media, s.opts.MediaKey, acct)
}

// prepareWith is prepare with other preprocessing options (mediaKey names them in the cache
// key): the retry at reduced size uses it.
func (s *Service) prepareWith(ctx context.Context, m *openai.Media, src *source, salt string, mo media.Options, mediaKey string, acct *memory.Account) (*item, error) {
	mod := m.Modality
	model, preset, err := s.models.ForModality(mod)
	if err != nil {
		return nil, itemError(m, err)
	}
	it := &item{src: m, modality: mod, model: model}
	if m.URL == "" && m.Data == nil && m.Frames == nil { // a uuid the server has seen
		known, ok := s.uuids.get(salt, m.UUID)
		if !ok || known.modality != mod {
			return nil, itemError(m, fmt.Errorf("uuid %q is not one this server has features for: send the media with it", m.UUID))
		}
		it.key, it.tokens, it.rows, it.id = known.key, known.tokens, nil, m.UUID
		return it, nil
	}
	mo.Admit = admitter(ctx, acct)
	mo.CountOnly = s.models.CountOnly // the engine encodes (--handoff tokens): count and key only
	var res *media.Result
	switch mod {
	case sequence.Image:
		res, err = media.Image(src.data, preset, mo)
	case sequence.Audio:
		res, err = media.Audio(ctx, src.data, preset, mo)
	case sequence.Video:
		res, err = media.Video(ctx, src.data, src.frames, preset, mo)
	}
	if err != nil {
		return nil, itemError(m, err)
	}
	if s.models.CountOnly {
		it.tokens = res.Tokens // the engine encodes it (--handoff tokens): the count is all
	} else {
		// The encoder inputs live until the request ends (the encoders read them): admitted
		// now, once made, since only the preprocessing knows their size (small beside the
		// decode's).
		if err := acct.Reserve(ctx, int64(len(res.Input.Data)), "encoder inputs"); err != nil {
			return nil, itemError(m, err)
		}
		if err := it.split(res); err != nil {
			return nil, itemError(m, err)
		}
	}
	it.detail = res.Detail
	content := res.Key.Hex()
	it.id = content
	if m.UUID != "" {
		it.id = m.UUID
	}
	it.key = features.Key{Salt: salt, Content: content, Model: model.Name + "/" + model.Select().String(),
		Preprocess: preset.Name + "/" + mediaKey}
	if m.UUID != "" {
		s.uuids.put(salt, m.UUID, knownItem{key: it.key, tokens: it.tokens, modality: mod})
	}
	return it, nil
}

// split cuts a preprocessing result into the encoder's inputs: a picture is one input, a
// video one per frame, audio one per 3000-frame window.
func (it *item) split(res *media.Result) error {
	t := res.Input
	if t.DType != native.F32 {
		return fmt.Errorf("preprocessing gave %v, the encoders take %v", t.DType, native.F32)
	}
	all := native.AsFloat32(t.Data)
	var n, frames int
	switch {
	case it.modality == sequence.Image && len(t.Shape) == 3:
		n = 1
	case (it.modality == sequence.Image || it.modality == sequence.Video) && len(t.Shape) == 4: // pictures, frames
		n = t.Shape[0]
	case it.modality == sequence.Audio && len(t.Shape) == 3:
		n, frames = t.Shape[0], t.Shape[2]
	default:
		return fmt.Errorf("preprocessing gave shape %v for %v", t.Shape, it.modality)
	}
	if n == 0 {
		return fmt.Errorf("nothing to encode")
	}
	per := len(all) / n
	for i := range n {
		in := encoder.Input{Data: all[i*per : (i+1)*per : (i+1)*per], Frames: frames}
		rows, err := it.model.Tokens(in)
		if err != nil {
			return err
		}
		it.inputs = append(it.inputs, in)
		it.rows = append(it.rows, rows)
		it.tokens += rows
	}
	if it.tokens != res.Tokens {
		return fmt.Errorf("the encoder gives %d tokens, the preset counted %d", it.tokens, res.Tokens)
	}
	return nil
}

// knownItem is what the uuid table remembers of an item a client named.
type knownItem struct {
	key      features.Key
	tokens   int
	modality sequence.Modality
}
