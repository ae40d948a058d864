package transfer

// A minimal, independent reader of torch.save files for the tests: a zip, a pickle machine
// that knows the opcodes torch.save emits for one tensor, and the persistent storage records.
// It reads files PyTorch itself wrote (testdata/) and the writer's output the same way.

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
)

type torchTensor struct {
	storage string // class name, e.g. BFloat16Storage
	shape   []int64
	stride  []int64
	offset  int64
	data    []byte // the whole storage record
}

type global struct{ module, name string }

type persistent struct {
	class string
	key   string
	numel int64
}

type mark struct{}

type reduceCall struct {
	fn   global
	args []any
}

func readTorch(b []byte) (*torchTensor, map[string]int64, error) {
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, nil, err
	}
	files := map[string]*zip.File{}
	offsets := map[string]int64{}
	prefix := ""
	for i, f := range zr.File {
		if i == 0 {
			prefix = f.Name[:strings.Index(f.Name, "/")+1]
		}
		name := strings.TrimPrefix(f.Name, prefix)
		files[name] = f
		if off, err := f.DataOffset(); err == nil {
			offsets[name] = off
		}
	}
	read := func(name string) ([]byte, error) {
		f := files[name]
		if f == nil {
			return nil, fmt.Errorf("no record %q", name)
		}
		rc, err := f.Open()
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	pkl, err := read("data.pkl")
	if err != nil {
		return nil, nil, err
	}
	obj, err := unpickle(pkl)
	if err != nil {
		return nil, nil, err
	}
	call, ok := obj.(reduceCall)
	if !ok || call.fn != (global{"torch._utils", "_rebuild_tensor_v2"}) || len(call.args) < 4 {
		return nil, nil, fmt.Errorf("not a _rebuild_tensor_v2 call: %#v", obj)
	}
	st := call.args[0].(persistent)
	t := &torchTensor{storage: st.class, offset: call.args[1].(int64)}
	for _, v := range call.args[2].([]any) {
		t.shape = append(t.shape, v.(int64))
	}
	for _, v := range call.args[3].([]any) {
		t.stride = append(t.stride, v.(int64))
	}
	if t.data, err = read("data/" + st.key); err != nil {
		return nil, nil, err
	}
	return t, offsets, nil
}

// unpickle runs the subset of the pickle machine torch.save's tensors use.
func unpickle(b []byte) (any, error) {
	var stack []any
	memo := map[uint32]any{}
	pop := func() any { v := stack[len(stack)-1]; stack = stack[:len(stack)-1]; return v }
	popMark := func() []any {
		for i := len(stack) - 1; i >= 0; i-- {
			if _, ok := stack[i].(mark); ok {
				items := append([]any(nil), stack[i+1:]...)
				stack = stack[:i]
				return items
			}
		}
		return nil
	}
	line := func(i int) (string, int) {
		j := bytes.IndexByte(b[i:], '\n')
		return string(b[i : i+j]), i + j + 1
	}
	for i := 0; i < len(b); {
		op := b[i]
		i++
		switch op {
		case 0x80: // PROTO
			i++
		case 'c': // GLOBAL
			var mod, name string
			mod, i = line(i)
			name, i = line(i)
			stack = append(stack, global{mod, name})
		case '(':
			stack = append(stack, mark{})
		case 't':
			stack = append(stack, popMark())
		case ')':
			stack = append(stack, []any{})
		case 0x85, 0x86, 0x87: // TUPLE1..3
			n := int(op - 0x84)
			items := append([]any(nil), stack[len(stack)-n:]...)
			stack = append(stack[:len(stack)-n], items)
		case 'X':
			n := int(binary.LittleEndian.Uint32(b[i:]))
			stack = append(stack, string(b[i+4:i+4+n]))
			i += 4 + n
		case 0x8c: // SHORT_BINUNICODE
			n := int(b[i])
			stack = append(stack, string(b[i+1:i+1+n]))
			i += 1 + n
		case 'K':
			stack = append(stack, int64(b[i]))
			i++
		case 'M':
			stack = append(stack, int64(binary.LittleEndian.Uint16(b[i:])))
			i += 2
		case 'J':
			stack = append(stack, int64(int32(binary.LittleEndian.Uint32(b[i:]))))
			i += 4
		case 0x8a: // LONG1
			n := int(b[i])
			var v int64
			for k := n - 1; k >= 0; k-- {
				v = v<<8 | int64(b[i+1+k])
			}
			stack = append(stack, v)
			i += 1 + n
		case 0x89:
			stack = append(stack, false)
		case 0x88:
			stack = append(stack, true)
		case 'Q': // BINPERSID
			id := pop().([]any)
			stack = append(stack, persistent{class: id[1].(global).name, key: id[2].(string), numel: id[4].(int64)})
		case 'R':
			args := pop().([]any)
			fn := pop().(global)
			stack = append(stack, reduceCall{fn, args})
		case 'q': // BINPUT
			memo[uint32(b[i])] = stack[len(stack)-1]
			i++
		case 'r': // LONG_BINPUT
			memo[binary.LittleEndian.Uint32(b[i:])] = stack[len(stack)-1]
			i += 4
		case 'h': // BINGET
			stack = append(stack, memo[uint32(b[i])])
			i++
		case 'j':
			stack = append(stack, memo[binary.LittleEndian.Uint32(b[i:])])
			i += 4
		case '}': // EMPTY_DICT (OrderedDict built by REDUCE anyway)
			stack = append(stack, map[string]any{})
		case '.':
			return pop(), nil
		default:
			return nil, fmt.Errorf("pickle opcode %#x at %d not handled", op, i-1)
		}
	}
	return nil, fmt.Errorf("pickle without STOP")
}
