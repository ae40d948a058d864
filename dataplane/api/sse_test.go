package api

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/openai"
)

func TestSSE(t *testing.T) {
	var buf bytes.Buffer
	s := NewSSE(bufio.NewWriter(&buf))
	require.NoError(t, s.Event(openai.ChatChunk{ID: "c1", Object: "chat.completion.chunk", Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Content: "hi"}}}}))
	require.NoError(t, s.Done())
	lines := strings.Split(buf.String(), "\n\n")
	require.Len(t, lines, 3)
	require.True(t, strings.HasPrefix(lines[0], `data: {"id":"c1","object":"chat.completion.chunk"`))
	require.Equal(t, "data: [DONE]", lines[1])
}
