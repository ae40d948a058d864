package chaos

// Scenarios about the daemon's own life: SIGTERM with streams in flight, and connections that
// hold every slot while the probes must still answer.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// sigtermDrain: 80 streamed completions in flight on slowed mock engines, then SIGTERM with
// --shutdown-timeout 10s. The daemon should exit 0 within the timeout (and a little), and a
// stream it had to cut should end with an SSE error event before the connection closes.
func sigtermDrain(ctx context.Context, t *trial) {
	const shutdown, streams = 10 * time.Second, 80
	d, err := t.startServe(ctx, "--workers=mock:2", "--mock-speedup=0.2", fmt.Sprintf("--shutdown-timeout=%v", shutdown))
	if err != nil {
		t.setup(err)
		return
	}
	t.timeout("shutdown-timeout", shutdown)
	var ends []<-chan stream
	var firsts []chan struct{}
	for i := range streams {
		first := make(chan struct{})
		body := chatBody(4000, true, textPart(fmt.Sprintf("Stream %d: tell a very long story.", i)))
		ends = append(ends, t.openStream(ctx, d.base+chatPath, body, 50*time.Second, first))
		firsts = append(firsts, first)
	}
	started := 0
	wait := time.After(20 * time.Second)
	for _, f := range firsts {
		select {
		case <-f:
			started++
		case <-wait:
		case <-ctx.Done():
		}
	}
	t.note("%d of %d streams had their first event before SIGTERM", started, streams)
	if !t.stopGroup(d.proc, syscall.SIGTERM) {
		return
	}
	sent := time.Now()
	exitLimit := shutdown + 15*time.Second
	select {
	case <-d.done:
	case <-time.After(exitLimit):
	case <-ctx.Done():
	}
	var took time.Duration
	if d.exited() {
		d.mu.Lock()
		took = d.exitedAt.Sub(sent)
		d.mu.Unlock()
		t.mu.Lock()
		t.row.LongestWait, t.row.AliveNote = took, d.exitText()+" after SIGTERM"
		t.mu.Unlock()
		t.note("%s %s after SIGTERM", d.exitText(), formatDuration(took))
		if d.exitText() != "exit 0" {
			t.fail("%s after SIGTERM", d.exitText())
		}
		if took > shutdown+2*time.Second {
			t.fail("exit took %s > shutdown-timeout %s + 2s", formatDuration(took), formatDuration(shutdown))
		}
	} else {
		t.mu.Lock()
		t.row.LongestWait = time.Since(sent)
		t.mu.Unlock()
		t.fail("still running %s after SIGTERM", formatDuration(time.Since(sent)))
		d.kill()
	}
	finished, errEvents, cut := 0, 0, 0
	var first, last time.Duration
	for _, e := range ends {
		var s stream
		select {
		case s = <-e:
		case <-time.After(5 * time.Second):
			s.kind = "timeout"
		}
		t.mu.Lock()
		t.row.Statuses[s.key()]++
		t.mu.Unlock()
		if !s.endedAt.IsZero() {
			at := s.endedAt.Sub(sent)
			if first == 0 || at < first {
				first = at
			}
			last = max(last, at)
		}
		switch {
		case s.done:
			finished++
		case s.errEvent:
			errEvents++
		case s.status == http.StatusOK:
			cut++
		}
	}
	t.note("streams: %d finished, %d ended with an error event, %d cut without one; they ended %s to %s after SIGTERM",
		finished, errEvents, cut, formatDuration(first), formatDuration(last))
	if cut > 0 {
		t.fail("%d of %d streams cut without an error event", cut, streams)
	}
}

// slowHeaders: --max-conns 20, and 20 connections that send their request headers one byte a
// second. /healthz and /metrics on the separate --admin-listen must still answer 200.
func slowHeaders(ctx context.Context, t *trial) {
	admin, err := freePort()
	if err != nil {
		t.setup(err)
		return
	}
	const conns = 20
	d, err := t.startServe(ctx, fmt.Sprintf("--max-conns=%d", conns), "--admin-listen="+admin)
	if err != nil {
		t.setup(err)
		return
	}
	t.client.CloseIdleConnections()  // a pooled connection would hold a slot, and dodge the test
	sleep(ctx, 300*time.Millisecond) // for the daemon to see it close
	stop := make(chan struct{})
	var held []net.Conn
	t.onCleanup(func() {
		close(stop)
		for _, c := range held {
			c.Close()
		}
	})
	head := "GET /healthz HTTP/1.1\r\nHost: " + d.addr + "\r\nX-Slow: " + strings.Repeat("a", 600) + "\r\n\r\n"
	for range conns {
		c, err := rawConn(ctx, d.addr, nil)
		if err != nil {
			t.note("slow connection %d: %v", len(held)+1, err)
			break
		}
		held = append(held, c)
		go func() { // one byte a second until the scenario ends or the daemon hangs up
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for i := 0; i < len(head); i++ {
				if _, err := c.Write([]byte{head[i]}); err != nil {
					return
				}
				select {
				case <-tick.C:
				case <-stop:
					return
				}
			}
		}()
	}
	sleep(ctx, 2*time.Second)
	const probeTimeout = 3 * time.Second
	t.timeout("probe", probeTimeout)
	probe := d.admin
	if probe == "" {
		probe = d.base
		t.note("no admin listener: probes went to the API listener")
	}
	// Each probe on its own connection, with a pause for the daemon to see the last one close.
	h := t.probe(ctx, probe+"/healthz", probeTimeout)
	sleep(ctx, 300*time.Millisecond)
	m := t.probe(ctx, probe+"/metrics", probeTimeout)
	sleep(ctx, 300*time.Millisecond)
	t.count(h)
	t.count(m)
	api := t.probe(ctx, d.base+"/healthz", probeTimeout)
	open := 0
	for _, c := range held {
		if !closedByPeer(c, 10*time.Millisecond) {
			open++
		}
	}
	t.note("%d slow connections, %d still open; /healthz %s, /metrics %s; API listener /healthz %s", len(held), open, h.key(), m.key(), api.key())
	if h.status != http.StatusOK || m.status != http.StatusOK {
		t.fail("probes while the slots are held: /healthz %s, /metrics %s", h.key(), m.key())
	}
}
