// Package workertest has test helpers for code that talks to LLM workers.
package workertest

import (
	"net"
	"sync"
	"testing"
)

// Stopped serves ln as a SIGSTOPped engine would: it accepts connections and never reads or
// answers them, until the test ends. It returns ln's base URL.
func Stopped(t testing.TB, ln net.Listener) string {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read or answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}
