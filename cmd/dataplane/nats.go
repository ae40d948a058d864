package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// The NATS server that `router`, `mock` and `bench fleet` run in-process with `--nats
// embedded` (or `--kv-events nats`): a single node for engines and routers on one machine.

// startEmbeddedNATS starts an in-process NATS server listening on addr (HOST:PORT; port 0
// picks one) and returns it once it accepts clients. Shut it down with Shutdown.
func startEmbeddedNATS(addr string) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	s, err := server.NewServer(&server.Options{Host: host, Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded nats: not ready after 10s")
	}
	return s, nil
}
