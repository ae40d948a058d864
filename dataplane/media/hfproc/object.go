package hfproc

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Error names the file and the field a processor setting was refused for.
type Error struct {
	File  string // "preprocessor_config.json", ...
	Field string // "patch_size", "size.shortest_edge"; "" for the file as a whole
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("processor config %s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("processor config %s: field %q: %s", e.File, e.Field, e.Msg)
}

// object is one JSON object of a config file. Getters record which keys were read; the first
// bad value is kept in err (later getters then do nothing), so a builder reads every field it
// wants and checks once.
type object struct {
	file   string
	prefix string // the path of a nested object ("image_processor.")
	m      map[string]json.RawMessage
	used   map[string]bool
	err    error
}

func parseObject(file string, data []byte) (*object, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, &Error{File: file, Msg: fmt.Sprintf("not a JSON object: %v", err)}
	}
	if m == nil {
		return nil, &Error{File: file, Msg: "not a JSON object"}
	}
	return &object{file: file, m: m, used: map[string]bool{}}, nil
}

func (o *object) fail(key, format string, args ...any) {
	if o.err == nil {
		o.err = &Error{File: o.file, Field: o.prefix + key, Msg: fmt.Sprintf(format, args...)}
	}
}

// raw is the value of key, nil when absent or JSON null (both mean "the class default").
func (o *object) raw(key string) json.RawMessage {
	v, ok := o.m[key]
	if !ok || o.err != nil {
		return nil
	}
	o.used[key] = true
	if string(v) == "null" {
		return nil
	}
	return v
}

func (o *object) has(key string) bool { return o.raw(key) != nil }

// ignore marks keys that are read and deliberately unused (metadata, batching, settings whose
// default is all we do).
func (o *object) ignore(keys ...string) {
	for _, k := range keys {
		if _, ok := o.m[k]; ok {
			o.used[k] = true
		}
	}
}

// unknown refuses the first key (in sorted order) nobody read.
func (o *object) unknown() error {
	if o.err != nil {
		return o.err
	}
	var left []string
	for k := range o.m {
		if !o.used[k] {
			left = append(left, k)
		}
	}
	if len(left) > 0 {
		slices.Sort(left)
		o.fail(left[0], "unknown field (%d unknown in all: %s)", len(left), strings.Join(left, ", "))
	}
	return o.err
}

// maxInt bounds every integer setting: sizes and pixel counts fit comfortably.
const maxInt = 1 << 40

func (o *object) int(key string, def int) int {
	v := o.raw(key)
	if v == nil {
		return def
	}
	return o.intOf(key, v)
}

func (o *object) intOf(key string, v json.RawMessage) int {
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || f < 0 || f > maxInt {
		o.fail(key, "%s is not a whole number in 0..2^40", v)
		return 0
	}
	return int(f)
}

func (o *object) float(key string, def float64) float64 {
	v := o.raw(key)
	if v == nil {
		return def
	}
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		o.fail(key, "%s is not a number", v)
		return def
	}
	return f
}

func (o *object) bool(key string, def bool) bool {
	v := o.raw(key)
	if v == nil {
		return def
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		o.fail(key, "%s is not true or false", v)
		return def
	}
	return b
}

func (o *object) str(key, def string) string {
	v := o.raw(key)
	if v == nil {
		return def
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		o.fail(key, "%s is not a string", v)
		return def
	}
	return s
}

// floats3 is a per-channel setting: three numbers, or one for all channels.
func (o *object) floats3(key string, def [3]float32) [3]float32 {
	v := o.raw(key)
	if v == nil {
		return def
	}
	var one float64
	if json.Unmarshal(v, &one) == nil {
		return [3]float32{float32(one), float32(one), float32(one)}
	}
	var list []float64
	if err := json.Unmarshal(v, &list); err != nil || len(list) != 3 {
		o.fail(key, "%.40s is not 3 numbers (one a channel)", v)
		return def
	}
	return [3]float32{float32(list[0]), float32(list[1]), float32(list[2])}
}

// sub is the nested object under key (nil when absent).
func (o *object) sub(key string) *object {
	v := o.raw(key)
	if v == nil {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil || m == nil {
		o.fail(key, "%.40s is not an object", v)
		return nil
	}
	return &object{file: o.file, prefix: o.prefix + key + ".", m: m, used: map[string]bool{}}
}

// pairs is a list of [a, b] integer pairs (LLaVA-NeXT's image_grid_pinpoints).
func (o *object) pairs(key string, limit int) [][2]int {
	v := o.raw(key)
	if v == nil {
		return nil
	}
	var list [][]float64
	if err := json.Unmarshal(v, &list); err != nil || len(list) == 0 || len(list) > limit {
		o.fail(key, "%.40s is not a list of 1..%d [height, width] pairs", v, limit)
		return nil
	}
	out := make([][2]int, len(list))
	for i, p := range list {
		if len(p) != 2 || p[0] != math.Trunc(p[0]) || p[1] != math.Trunc(p[1]) || p[0] < 1 || p[1] < 1 || p[0] > maxInt || p[1] > maxInt {
			o.fail(key, "entry %d (%v) is not a [height, width] pair of positive whole numbers", i, p)
			return nil
		}
		out[i] = [2]int{int(p[0]), int(p[1])}
	}
	return out
}

// sizeDict reads a transformers size setting: {"height", "width"}, {"shortest_edge"[,
// "longest_edge"]}, or a bare number (what it means is the caller's). Absent keys are 0.
type sizeDict struct {
	Height, Width, Shortest, Longest int
	Bare                             int // the setting was a number
	MinPixels, MaxPixels             int // Qwen2-VL's older {"min_pixels", "max_pixels"}
}

func (o *object) size(key string) (sizeDict, bool) {
	v := o.raw(key)
	if v == nil {
		return sizeDict{}, false
	}
	var s sizeDict
	var one float64
	if json.Unmarshal(v, &one) == nil {
		s.Bare = o.intOf(key, v)
		return s, o.err == nil
	}
	d := o.sub(key)
	if d == nil {
		return s, false
	}
	s.Height, s.Width = d.int("height", 0), d.int("width", 0)
	s.Shortest, s.Longest = d.int("shortest_edge", 0), d.int("longest_edge", 0)
	s.MinPixels, s.MaxPixels = d.int("min_pixels", 0), d.int("max_pixels", 0)
	if err := d.unknown(); err != nil {
		o.err = err
		return s, false
	}
	return s, true
}
