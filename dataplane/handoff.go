package dataplane

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"

	"github.com/zeebo/xxh3"

	"dataplane/dataplane/worker"
	"dataplane/features"
	"dataplane/native"
	"dataplane/router"
	"dataplane/transfer"
)

// How requests with media reach the LLM workers (ServiceOptions.Handoff) decides what the
// daemon does after placing the media and how it hashes the request for the router, so that
// the blocks it looks up are the ones the engine will publish (transfer/NOTES.md):
//
//	""      in-process workers (the mock fleet): merged features, blocks hashed by token ids with
//	        each item's id (the client's uuid, else its content hash) in the blocks it covers
//	embeds  merged features sent as prompt_embeds; blocks hashed as vLLM keys them: token ids of
//	        zeros and each block's SHA-256 (embeds.go)
//	ec      each item's features written to the EC directory under its name (transfer.ECName of
//	        its key), the chat request sent with those names as uuids; blocks hashed by token ids
//	        with the names
//	tokens  nothing encoded; the chat request sent with the names as uuids, the engine encodes
//	        itself; blocks hashed as for ec

// handoff is the service's hand-off mode and what it needs.
type handoff struct {
	http    bool // a mode was chosen: HTTP engines
	mode    worker.Handoff
	ec      *transfer.ECDir // ec
	digests *digestCache    // embeds
}

// setupHandoff reads opts.Handoff, opens the EC directory for "ec" (ECBytes, by default the
// feature store's host capacity) and ties it to the store: a key the store lets go loses its
// file (opts.Features.OnForget, set here before the store is made).
func (s *Service) setupHandoff(opts *ServiceOptions) error {
	if opts.Handoff == "" {
		if opts.ECDir != "" {
			return fmt.Errorf("an EC directory (%s) without the ec hand-off", opts.ECDir)
		}
		return nil
	}
	mode, err := worker.ParseHandoff(opts.Handoff)
	if err != nil {
		return err
	}
	s.handoff = handoff{http: true, mode: mode}
	switch mode {
	case worker.HandoffEmbeds:
		s.handoff.digests = newDigestCache(digestCacheEntries)
	case worker.HandoffEC:
		if opts.ECDir == "" {
			return fmt.Errorf("the ec hand-off needs an EC directory (vLLM's shared_storage_path)")
		}
		capBytes := opts.ECBytes
		if capBytes <= 0 {
			capBytes = opts.Features.Host.Capacity
		}
		if capBytes <= 0 {
			capBytes = features.DefaultOptions().Host.Capacity
		}
		if s.handoff.ec, err = transfer.OpenECDir(opts.ECDir, capBytes); err != nil {
			return err
		}
		ec, next := s.handoff.ec, opts.Features.OnForget
		opts.Features.OnForget = func(k features.Key) {
			ec.Forget(transfer.ECName(k))
			if next != nil {
				next(k)
			}
		}
	}
	if opts.ECDir != "" && mode != worker.HandoffEC {
		return fmt.Errorf("an EC directory (%s) with the %v hand-off", opts.ECDir, mode)
	}
	return nil
}

// Handoff is the hand-off mode ("" for in-process workers).
func (s *Service) Handoff() string {
	if !s.handoff.http {
		return ""
	}
	return s.handoff.mode.String()
}

// ECDir is the EC directory (nil but in the ec hand-off).
func (s *Service) ECDir() *transfer.ECDir { return s.handoff.ec }

// mediaID is the identifier an item has for the engine and in the router's blocks.
func (s *Service) mediaID(it *item) string {
	if s.handoff.http && s.handoff.mode.SendsChat() {
		return transfer.ECName(it.key)
	}
	return it.id
}

// encodes reports whether the request's media are encoded here (not in the tokens hand-off).
func (r *request) encodes() bool {
	return !r.s.handoff.http || r.s.handoff.mode != worker.HandoffTokens
}

// checkHandoff refuses, before any work, a request with media the chosen hand-off cannot
// carry: the chat hand-offs send the client's chat, so media must come in one, and in a form
// vLLM's chat endpoint takes.
func (r *request) checkHandoff() error {
	h := r.s.handoff
	if !h.http || !h.mode.SendsChat() || len(r.p.Media) == 0 {
		return nil
	}
	if r.p.Messages == nil {
		return fail(ErrInvalid, r.p.Media[0].Path, "with --handoff %v, media reach vLLM through its chat endpoint: send them in a /v1/chat/completions request", h.mode)
	}
	for _, m := range r.p.Media {
		if m.Frames != nil {
			return fail(ErrInvalid, m.Path, "with --handoff %v the engine reads the media itself, and vLLM takes no video given as pictures: send a video_url", h.mode)
		}
	}
	return nil
}

// routeInput is the request as the router hashes it: token ids, and media hashes in the blocks
// they cover; for prompt_embeds, tokens of zeros and each block's digest (embeds.go).
func (r *request) routeInput(dst []uint32) ([]uint32, []router.Media) {
	if r.s.handoff.http && r.s.handoff.mode == worker.HandoffEmbeds && len(r.items) > 0 {
		return r.routeEmbeds()
	}
	ids, spans := r.expanded()
	toks := slices.Grow(dst[:0], len(ids))[:len(ids)]
	for i, id := range ids {
		toks[i] = uint32(id)
	}
	rm := make([]router.Media, len(spans))
	for i, sp := range spans {
		rm[i] = router.Media{Hash: router.MediaHash(sp.ID), Offset: sp.Start, Length: sp.End - sp.Start}
	}
	return toks, rm
}

// routeEmbeds plans the request's prompt_embeds blocks (r.emb) and returns what the router
// hashes: zeros, one media entry per full block.
func (r *request) routeEmbeds() ([]uint32, []router.Media) {
	s := r.s
	bs := s.router.Options().BlockSize
	src := rowSources(r.pm)
	itemHash := make([]uint64, len(r.items))
	for i, it := range r.items {
		itemHash[i] = xxh3.HashString(transfer.ECName(it.key))
	}
	table := s.models.Table
	row := table.Cols * table.DType.Size()
	hosts := make([][]byte, len(r.items)) // an item's features, once found ready
	rows := func(rs rowSrc) []byte {
		if rs.item < 0 {
			return table.Data[int(rs.v)*row : (int(rs.v)+1)*row]
		}
		if hosts[rs.item] == nil {
			hosts[rs.item] = r.readyFeatures(r.items[rs.item])
			if hosts[rs.item] == nil {
				return nil
			}
		}
		return hosts[rs.item][int(rs.v)*row : (int(rs.v)+1)*row]
	}
	var media []router.Media
	r.emb, media = planEmbeds(src, blockKeys(src, itemHash, bs), bs, s.handoff.digests, rows, r.id)
	r.emb.pm = r.pm
	return make([]uint32, r.pm.Len), media
}

// readyFeatures are an item's feature bytes if they are encoded already (a reuse hit), else nil.
func (r *request) readyFeatures(it *item) []byte {
	if it.rec == nil {
		return nil
	}
	select {
	case <-it.rec.Ready():
	default:
		return nil
	}
	if it.rec.Err() != nil {
		return nil
	}
	v, err := it.rec.Host()
	if err != nil || v.Len() < int64(it.tokens*r.s.models.Hidden*r.s.models.DType.Size()) {
		return nil
	}
	return v.Bytes()
}

// transferBytes is what the hand-off moves to a worker for this request (the router's cost
// term): the merged sequence, the items' features (ec), or nothing (tokens).
func (r *request) transferBytes() float64 {
	row := float64(r.s.models.Hidden * r.s.models.DType.Size())
	switch {
	case !r.s.handoff.http || r.s.handoff.mode == worker.HandoffEmbeds:
		return float64(r.pm.Len) * row
	case r.s.handoff.mode == worker.HandoffEC:
		n := 0
		for _, it := range r.items {
			n += it.tokens
		}
		return float64(n) * row
	}
	return 0
}

// remote says whether a worker is reached over the network (the transfer cost applies).
func remoteWorker(worker string) bool {
	return strings.HasPrefix(worker, "http://") || strings.HasPrefix(worker, "https://")
}

// handOff readies the encoded media for the worker, once every item is encoded: the merged
// sequence (in-process workers, embeds: its blocks the route did not know are then hashed and
// remembered), or each item's EC file (ec: the returned matrix is empty). An item the EC
// directory has no room for goes without a file: the engine encodes it itself.
func (r *request) handOff(ctx context.Context) (native.Matrix, error) {
	s := r.s
	if !s.handoff.http || s.handoff.mode == worker.HandoffEmbeds {
		m, err := r.merge(ctx)
		if err == nil && r.emb != nil && r.emb.pm == r.pm && m.Rows > 0 { // not if an item left since
			bs := s.router.Options().BlockSize
			if ferr := r.emb.fill(m, bs, min(4, runtime.GOMAXPROCS(0)), s.handoff.digests); ferr != nil {
				s.log.Warn("hashing the prompt_embeds blocks", "request", r.id, "err", ferr)
			}
		}
		return m, err
	}
	dt, width := s.models.DType, s.models.Hidden
	for _, it := range r.items {
		v, err := it.rec.Host()
		var m native.Matrix
		if err == nil {
			m, err = v.Matrix(dt, it.tokens, width)
		}
		if err != nil {
			return native.Matrix{}, &Error{Param: it.src.Path, Err: err}
		}
		ok, err := s.handoff.ec.Put(transfer.ECName(it.key), m)
		if err != nil {
			return native.Matrix{}, fail(nil, it.src.Path, "writing its EC file: %v", err)
		}
		if !ok {
			s.log.Warn("the EC directory is full: the engine encodes this item itself", "request", r.id, "item", it.src.Path,
				"dir", s.handoff.ec.Path())
		}
	}
	// The files stand for the merged sequence: prefill and the cache policy follow as after a merge.
	if err := r.fr.Merged(); err != nil {
		return native.Matrix{}, &Error{Err: err}
	}
	return native.Matrix{}, nil
}

// workerSpans are the request's media spans for the worker, with their source parts.
func (r *request) workerSpans(spans []worker.MediaSpan) []worker.MediaSpan {
	for i := range spans {
		if i < len(r.pm.Spans) {
			spans[i].Src = r.items[r.pm.Spans[i].Item].src
		}
	}
	return spans
}
