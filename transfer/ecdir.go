package transfer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"dataplane/native"
)

// ECDir is the daemon's directory of EC-connector files: one per item the feature store holds
// (ECName of its key), written before the request that needs it goes to the engine and
// removed when the store lets go of the key (Forget: the store's OnForget hook), so the files
// follow the store's cache policy and eviction. Bounded: files beyond Cap bytes are not
// written (Put reports false and the engine encodes that item itself). Safe for concurrent
// use; Forget never blocks (the store calls it under its lock): removals run on ECDir's own
// goroutine.
type ECDir struct {
	dir string
	cap int64

	mu       sync.Mutex
	live     map[string]*ecEntry
	used     int64                    // bytes of the live files (and of those being written)
	dying    map[string]struct{}      // forgotten, waiting for the janitor
	removing map[string]chan struct{} // being removed now: a Put of the name waits
	stats    ECDirStats
	closed   bool

	wake chan struct{} // capacity 1: the janitor has work
	done chan struct{} // closed by Close
	wg   sync.WaitGroup
}

type ecEntry struct {
	ready  chan struct{} // closed once written (err says how it went)
	err    error
	bytes  int64
	forget bool // forgotten while being written: the writer hands it to the janitor
}

// ECDirStats count what the directory did.
type ECDirStats struct {
	Files   int   // live files
	Bytes   int64 // their bytes
	Writes  int64 // files written
	Reused  int64 // Puts that found the file already there (or a forgotten one not yet removed)
	Refused int64 // Puts refused: the file would pass Cap
	Failed  int64 // writes that failed
	Removed int64 // files removed after Forget
}

// OpenECDir uses dir (created ECDirMode if missing; an existing directory keeps its mode)
// for at most capBytes of files, and removes every item folder a previous run left there
// (names as ECName makes them; nothing else is touched): their keys are in no store now.
func OpenECDir(dir string, capBytes int64) (*ECDir, error) {
	if capBytes <= 0 {
		return nil, fmt.Errorf("transfer: EC directory capacity %d bytes", capBytes)
	}
	if err := os.Mkdir(dir, ECDirMode); err == nil {
		if err := os.Chmod(dir, ECDirMode); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if e.IsDir() && isECName(e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("transfer: clearing %s: %w", dir, err)
			}
		}
	}
	d := &ECDir{dir: dir, cap: capBytes, live: map[string]*ecEntry{}, dying: map[string]struct{}{},
		removing: map[string]chan struct{}{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	d.wg.Add(1)
	go d.janitor()
	return d, nil
}

// Path is the directory.
func (d *ECDir) Path() string { return d.dir }

// Cap is the most bytes of files the directory holds.
func (d *ECDir) Cap() int64 { return d.cap }

// Put makes sure the file for name holds m: it writes it unless it is there (or being written
// by another Put, which it waits for). It reports false, without an error, when the file
// would take the directory past its capacity. name must be an ECName.
func (d *ECDir) Put(name string, m native.Matrix) (bool, error) {
	if !isECName(name) {
		return false, fmt.Errorf("transfer: %q is not an EC item name", name)
	}
	d.mu.Lock()
	for {
		if d.closed {
			d.mu.Unlock()
			return false, errors.New("transfer: EC directory closed")
		}
		ch := d.removing[name]
		if ch == nil {
			break
		}
		d.mu.Unlock()
		<-ch // the old file goes first
		d.mu.Lock()
	}
	if e := d.live[name]; e != nil {
		d.stats.Reused++
		d.mu.Unlock()
		<-e.ready
		return e.err == nil, e.err
	}
	size := int64(m.Bytes()) + 256 // the header: replaced by the file's size once written
	if _, ok := d.dying[name]; ok {
		// Forgotten but still on disk: the same key, so the same features (the encoders are
		// deterministic); take it back instead of writing it again.
		delete(d.dying, name)
		if st, err := os.Stat(ECCacheFile(d.dir, name)); err == nil {
			e := &ecEntry{ready: make(chan struct{}), bytes: st.Size()}
			close(e.ready)
			d.live[name] = e
			d.used += e.bytes
			d.stats.Reused++
			d.mu.Unlock()
			return true, nil
		}
	}
	if d.used+size > d.cap {
		d.stats.Refused++
		d.mu.Unlock()
		return false, nil
	}
	e := &ecEntry{ready: make(chan struct{}), bytes: size}
	d.live[name] = e
	d.used += size
	d.mu.Unlock()

	n, err := WriteECCache(d.dir, name, m)

	d.mu.Lock()
	defer close(e.ready)
	defer d.mu.Unlock()
	e.err = err
	if err != nil {
		d.stats.Failed++
		delete(d.live, name)
		d.used -= size
		return false, err
	}
	d.stats.Writes++
	d.used += n - size
	e.bytes = n
	if e.forget {
		d.retire(name, e)
	}
	return true, nil
}

// Forget lets the file for name go (the store no longer holds its key): it is removed soon,
// on ECDir's goroutine. Unknown names are ignored. It never blocks on I/O.
func (d *ECDir) Forget(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.live[name]
	if e == nil {
		return
	}
	select {
	case <-e.ready:
		d.retire(name, e)
	default:
		e.forget = true // still being written: the writer retires it
	}
}

// retire moves a written entry to the janitor's list. d.mu must be held.
func (d *ECDir) retire(name string, e *ecEntry) {
	delete(d.live, name)
	d.used -= e.bytes
	d.dying[name] = struct{}{}
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// janitor removes forgotten files, outside the lock; a Put of a name being removed waits.
func (d *ECDir) janitor() {
	defer d.wg.Done()
	for {
		select {
		case <-d.wake:
		case <-d.done:
			return
		}
		d.mu.Lock()
		names := make([]string, 0, len(d.dying))
		for name := range d.dying {
			names = append(names, name)
			d.removing[name] = make(chan struct{})
		}
		clear(d.dying)
		d.mu.Unlock()
		for _, name := range names {
			err := os.RemoveAll(filepath.Join(d.dir, name))
			d.mu.Lock()
			if err == nil {
				d.stats.Removed++
			}
			close(d.removing[name])
			delete(d.removing, name)
			d.mu.Unlock()
		}
	}
}

// Stats is a snapshot.
func (d *ECDir) Stats() ECDirStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Files, s.Bytes = len(d.live), d.used
	return s
}

// Close stops the janitor and removes every file the directory holds (an engine still reading
// one then encodes that item itself). Puts after Close fail.
func (d *ECDir) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	close(d.done)
	d.wg.Wait()
	d.mu.Lock()
	live := make(map[string]*ecEntry, len(d.live))
	for name, e := range d.live {
		live[name] = e
	}
	names := make([]string, 0, len(d.dying))
	for name := range d.dying {
		names = append(names, name)
	}
	clear(d.live)
	clear(d.dying)
	d.used = 0
	d.mu.Unlock()
	var first error
	remove := func(name string) {
		if err := os.RemoveAll(filepath.Join(d.dir, name)); err != nil && first == nil {
			first = err
		}
	}
	for name, e := range live {
		<-e.ready // a Put that started before Close finishes its file first
		remove(name)
	}
	for _, name := range names {
		remove(name)
	}
	return first
}
