package dataplane

// Version is the release this binary was built from; the Makefile sets it from `git describe`
// (-ldflags "-X dataplane/dataplane.Version=...").
var Version = "dev"
