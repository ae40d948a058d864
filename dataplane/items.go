package dataplane

import (
	"context"
	"fmt"
	"strings"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/media"
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
}

// itemError is a failure to prepare an item: the item's bytes or content are unusable (its
// chain keeps the fetch error, if any, which says more).
func itemError(m *openai.Media, err error) *Error {
	return &Error{Param: m.Path, Kind: ErrInvalid, Err: err}
}

// bytesOf returns an item's bytes: inline data, a data: URL, or a fetch.
func (s *Service) bytesOf(ctx context.Context, m *openai.Media) ([]byte, error) {
	if m.Data != nil {
		return m.Data, nil
	}
	if strings.HasPrefix(m.URL, "data:") {
		d, err := media.ParseDataURL(m.URL, int(s.opts.MaxMediaBytes))
		if err != nil {
			return nil, err
		}
		return d.Data, nil
	}
	return s.fetcher.Fetch(ctx, m.URL)
}

// prepare turns one media part into an item: its bytes, the preset's preprocessing, the
// encoder inputs, the exact token count and the cache key. An item given only by a uuid is
// resolved through the uuid table (it must still be cached).
func (s *Service) prepare(ctx context.Context, m *openai.Media, salt string) (*item, error) {
	return s.prepareWith(ctx, m, salt, s.opts.Media, s.opts.MediaKey)
}

// prepareWith is prepare with other preprocessing options (mediaKey names them in the cache
// key): the retry at reduced size uses it.
func (s *Service) prepareWith(ctx context.Context, m *openai.Media, salt string, mo media.Options, mediaKey string) (*item, error) {
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
	var data []byte
	var frames [][]byte
	if m.Frames != nil {
		for i, u := range m.Frames {
			b, err := s.bytesOf(ctx, &openai.Media{URL: u})
			if err != nil {
				return nil, itemError(m, fmt.Errorf("picture %d: %w", i, err))
			}
			frames = append(frames, b)
		}
	} else if data, err = s.bytesOf(ctx, m); err != nil {
		return nil, itemError(m, err)
	}
	var res *media.Result
	switch mod {
	case sequence.Image:
		res, err = media.Image(data, preset, mo)
	case sequence.Audio:
		res, err = media.Audio(ctx, data, preset, mo)
	case sequence.Video:
		res, err = media.Video(ctx, data, frames, preset, mo)
	}
	if err != nil {
		return nil, itemError(m, err)
	}
	if err := it.split(res); err != nil {
		return nil, itemError(m, err)
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
