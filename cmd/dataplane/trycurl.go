package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"net"
	"strconv"
)

// tryCurl is the one command `make run` prints: a chat completion with a small picture (a red
// disc on blue, drawn here so nothing is fetched) and a question about it.
func tryCurl(addr net.Addr, model string) string {
	host, port := "127.0.0.1", "8000"
	if tcp, ok := addr.(*net.TCPAddr); ok {
		port = strconv.Itoa(tcp.Port)
		if !tcp.IP.IsUnspecified() {
			host = tcp.IP.String()
		}
	}
	body, _ := json.Marshal(map[string]any{ // plain maps and strings: cannot fail
		"model": model, "max_tokens": 16,
		"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + discPNG()}},
			map[string]any{"type": "text", "text": "What is in this picture?"},
		}}},
	})
	url := "http://" + net.JoinHostPort(host, port) + "/v1/chat/completions"
	return "curl -s " + url + " -H 'Content-Type: application/json' -d '" + string(body) + "'"
}

// discPNG is a 32x32 PNG of a red disc on blue, base64-encoded.
func discPNG() string {
	const n = 32
	img := image.NewRGBA(image.Rect(0, 0, n, n))
	for y := range n {
		for x := range n {
			dx, dy := x-n/2, y-n/2
			c := color.RGBA{30, 60, 200, 255}
			if dx*dx+dy*dy < (n/3)*(n/3) {
				c = color.RGBA{220, 30, 30, 255}
			}
			img.Set(x, y, c)
		}
	}
	var buf bytes.Buffer
	png.Encode(&buf, img) //nolint:errcheck // into memory: cannot fail
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}
