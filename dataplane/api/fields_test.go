package api

import (
	"bufio"
	"bytes"

	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/openai"
)

// The sampling and output fields, logprobs and the request id, end to end: client → daemon →
// a fake vLLM on loopback (httptest) that records what it was sent and streams the logprobs
// vLLM would (dataplane/openai/testdata/logprobs.json, from a reference written from vLLM's
// serving code) → the client, in both layouts, streamed and whole.

// logprobsCase is one case of dataplane/openai/testdata/logprobs.json.
type logprobsCase struct {
	Name   string `json:"name"`
	K      int    `json:"k"`
	Chunks []struct {
		Text     string          `json:"text"`
		Logprobs json.RawMessage `json:"logprobs"`
	} `json:"chunks"`
	Text       string          `json:"text"`
	Completion json.RawMessage `json:"completion"`
	Chat       json.RawMessage `json:"chat"`
}

// fakeVLLM answers /v1/completions as vLLM streams one, with the logprobs of the reference case
// whose k is the request's logprobs; logprobs 20 it refuses as vLLM does past --max-logprobs.
type fakeVLLM struct {
	cases  map[int]logprobsCase
	mu     sync.Mutex
	bodies []map[string]any
	ids    []string
}

func newFakeVLLM(t *testing.T) (*fakeVLLM, string) {
	t.Helper()
	raw, err := os.ReadFile("../openai/testdata/logprobs.json")
	require.NoError(t, err)
	var cases []logprobsCase
	require.NoError(t, json.Unmarshal(raw, &cases))
	f := &fakeVLLM{cases: map[int]logprobsCase{}}
	for _, c := range cases {
		f.cases[c.K] = c
	}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.ids = append(f.ids, r.Header.Get("X-Request-Id"))
	f.mu.Unlock()
	k, withLogprobs := body["logprobs"].(float64)
	if k == 20 {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"Requested sample logprobs of 20, which is greater than max allowed: 5","type":"BadRequestError","param":"logprobs","code":400}}`)
		return
	}
	c := f.cases[int(k)]
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ch := range c.Chunks {
		lp := []byte("null")
		if withLogprobs {
			var b bytes.Buffer
			_ = json.Compact(&b, ch.Logprobs) // one SSE line
			lp = b.Bytes()
		}
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-x\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":%q,\"logprobs\":%s,\"finish_reason\":null}]}\n\n", ch.Text, lp)
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"stop\",\"stop_reason\":\"\\n\"}]}\n\n")
	fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\ndata: [DONE]\n\n")
}

func (f *fakeVLLM) last() (map[string]any, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[len(f.bodies)-1], f.ids[len(f.ids)-1]
}

// send posts body to path with headers; it returns the status, the response headers and the
// body (a stream's data events, [DONE] left out, when stream).
func (d *testDaemon) send(t *testing.T, path, body string, header map[string]string) (int, http.Header, []string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.base+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, []string{string(b)}
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && data != "[DONE]" {
			events = append(events, data)
		}
	}
	return resp.StatusCode, resp.Header, events
}

func TestFieldsAndLogprobsThroughAnHTTPWorker(t *testing.T) {
	engine, url := newFakeVLLM(t)
	d, _ := startHTTPDaemon(t, 0, url)
	user := `"messages":[{"role":"user","content":"Name a pet."}]`

	// Chat, whole: every forwarded field reaches the engine by vLLM's name; the engine's
	// completions-layout logprobs come back in chat's layout, as vLLM's chat endpoint writes them.
	ref := engine.cases[2]
	code, hdr, out := d.send(t, "/v1/chat/completions", `{`+user+`,"max_completion_tokens":5,"temperature":0.5,
		"top_p":0.9,"top_k":8,"min_p":0.01,"seed":3,"stop":["\n"],"stop_token_ids":[7],"presence_penalty":0.1,
		"frequency_penalty":0.2,"repetition_penalty":1.1,"logit_bias":{"9":-5},"min_tokens":1,"ignore_eos":false,
		"skip_special_tokens":false,"logprobs":true,"top_logprobs":2,"user":"u1",
		"response_format":{"type":"json_schema","json_schema":{"name":"pet","schema":{"type":"object"}}}}`,
		map[string]string{"X-Request-Id": "client-42"})
	require.Equal(t, 200, code, out[0])
	require.Equal(t, "client-42", hdr.Get("X-Request-Id"), "echoed")
	var whole struct {
		ID      string `json:"id"`
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			Logprobs     json.RawMessage          `json:"logprobs"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(out[0]), &whole))
	require.Equal(t, "client-42", whole.ID)
	require.Equal(t, ref.Text, whole.Choices[0].Message.Content)
	require.JSONEq(t, string(ref.Chat), string(whole.Choices[0].Logprobs))
	require.Equal(t, "stop", whole.Choices[0].FinishReason)
	body, id := engine.last()
	require.Equal(t, "client-42", id, "forwarded as X-Request-Id")
	sent, _ := json.Marshal(body)
	for _, field := range []string{`"max_tokens":5`, `"temperature":0.5`, `"top_p":0.9`, `"top_k":8`, `"min_p":0.01`,
		`"seed":3`, `"stop":["\n"]`, `"stop_token_ids":[7]`, `"presence_penalty":0.1`, `"frequency_penalty":0.2`,
		`"repetition_penalty":1.1`, `"logit_bias":{"9":-5}`, `"min_tokens":1`, `"skip_special_tokens":false`,
		`"logprobs":2`, `"response_format":{"json_schema":{"name":"pet","schema":{"type":"object"}},"type":"json_schema"}`} {
		require.Contains(t, string(sent), field)
	}
	for _, absent := range []string{"ignore_eos", "user", "top_logprobs", "messages", "request_id"} {
		require.NotContains(t, body, absent)
	}
	decision := get200(t, d.base+"/debug/route?request_id=client-42")
	require.Contains(t, decision, `"request_id":"client-42"`, "the decision log knows the client's id")

	// Chat, streamed: the chunks' logprobs add up to the same.
	code, hdr, events := d.send(t, "/v1/chat/completions", `{`+user+`,"stream":true,"logprobs":true,"top_logprobs":2}`, nil)
	require.Equal(t, 200, code)
	require.Regexp(t, `^dp-\d+-[0-9a-f]+$`, hdr.Get("X-Request-Id"), "made when the client sent none")
	var content []any
	for _, ev := range events {
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Logprobs *struct{ Content []any } `json:"logprobs"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(ev), &c), ev)
		require.Equal(t, hdr.Get("X-Request-Id"), c.ID)
		for _, ch := range c.Choices {
			if ch.Logprobs != nil {
				content = append(content, ch.Logprobs.Content...)
			}
		}
	}
	streamed, _ := json.Marshal(map[string]any{"content": content})
	require.JSONEq(t, string(ref.Chat), string(streamed))
	_, id = engine.last()
	require.Equal(t, hdr.Get("X-Request-Id"), id)

	// Completions, whole and streamed: the completions layout as the engine sent it, the
	// alternatives in the engine's order (an ordered decode compares it).
	for _, k := range []int{0, 2, 5} {
		ref := engine.cases[k]
		var want openai.CompletionLogprobs
		require.NoError(t, json.Unmarshal(ref.Completion, &want))
		code, _, out := d.send(t, "/v1/completions", fmt.Sprintf(`{"prompt":"Name a pet.","max_tokens":5,"logprobs":%d}`, k), nil)
		require.Equal(t, 200, code, out[0])
		var c struct {
			Choices []struct {
				Text     string                     `json:"text"`
				Logprobs *openai.CompletionLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(out[0]), &c))
		require.Equal(t, ref.Text, c.Choices[0].Text)
		require.Equal(t, want, *c.Choices[0].Logprobs, ref.Name)

		code, _, events := d.send(t, "/v1/completions", fmt.Sprintf(`{"prompt":"Name a pet.","max_tokens":5,"logprobs":%d,"stream":true}`, k), nil)
		require.Equal(t, 200, code)
		var all openai.CompletionLogprobs
		text := ""
		for _, ev := range events {
			var c struct {
				Choices []struct {
					Text     string                     `json:"text"`
					Logprobs *openai.CompletionLogprobs `json:"logprobs"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal([]byte(ev), &c), ev)
			for _, ch := range c.Choices {
				text += ch.Text
				if ch.Logprobs != nil {
					all.Append(ch.Logprobs)
				}
			}
		}
		require.Equal(t, ref.Text, text)
		require.Equal(t, want, all, ref.Name)
	}

	// No logprobs asked: none sent, "logprobs": null as OpenAI writes it.
	code, _, out = d.send(t, "/v1/chat/completions", `{`+user+`,"max_tokens":3}`, nil)
	require.Equal(t, 200, code)
	require.Contains(t, out[0], `"logprobs":null`)
	body, _ = engine.last()
	require.NotContains(t, body, "logprobs")

	// The engine's refusal is the client's 400, naming what it named.
	code, _, out = d.send(t, "/v1/completions", `{"prompt":"x","logprobs":20}`, map[string]string{"X-Request-Id": "r-400"})
	require.Equal(t, 400, code, out[0])
	require.JSONEq(t, `{"error":{"message":"logprobs: the LLM worker refused the request: Requested sample logprobs of 20, which is greater than max allowed: 5",
		"type":"invalid_request_error","param":"logprobs","code":400}}`, out[0])

	// Echo is the daemon's: the prompt's text before the completion's.
	code, _, out = d.send(t, "/v1/completions", `{"prompt":"Name a pet.","max_tokens":3,"echo":true}`, nil)
	require.Equal(t, 200, code, out[0])
	require.Contains(t, out[0], `"text":"Name a pet.`+engine.cases[0].Text+`"`)
	body, _ = engine.last()
	require.NotContains(t, body, "echo")
	code, _, events = d.send(t, "/v1/completions", `{"prompt":"Name a pet.","max_tokens":3,"echo":true,"stream":true}`, nil)
	require.Equal(t, 200, code)
	require.Contains(t, events[0], `"text":"Name a pet."`, "the first chunk")
	ids, err := d.svc.Tokenizer().Encode("Name a pet.")
	require.NoError(t, err)
	prompt, _ := json.Marshal(map[string]any{"prompt": ids, "max_tokens": 3, "echo": true})
	code, _, out = d.send(t, "/v1/completions", string(prompt), nil)
	require.Equal(t, 200, code, out[0])
	require.Contains(t, out[0], `"text":"Name a pet.`+engine.cases[0].Text+`"`, "token ids: their text, decoded")

	// A field the daemon cannot carry is refused before the engine sees anything.
	before := len(engine.bodies)
	code, hdr, out = d.send(t, "/v1/chat/completions", `{`+user+`,"tools":[{"type":"function","function":{"name":"f"}}]}`,
		map[string]string{"X-Request-Id": "bad id with spaces"})
	require.Equal(t, 400, code)
	require.Contains(t, out[0], `"param":"tools"`)
	require.Contains(t, out[0], "tool calls are not supported")
	require.Regexp(t, `^dp-\d+-[0-9a-f]+$`, hdr.Get("X-Request-Id"), "an unsafe id is replaced, on errors too")
	require.Equal(t, before, len(engine.bodies))
}

// X-Request-Id wins over vLLM's request_id body field, which serves when there is no header;
// ids may repeat (the router and the feature store key requests uniquely).
func TestRequestIDs(t *testing.T) {
	d := startDaemon(t, nil)
	code, hdr, out := d.send(t, "/v1/completions", `{"prompt":"a","max_tokens":1,"request_id":"from-body"}`, nil)
	require.Equal(t, 200, code, out[0])
	require.Equal(t, "from-body", hdr.Get("X-Request-Id"))
	code, hdr, _ = d.send(t, "/v1/completions", `{"prompt":"a","max_tokens":1,"request_id":"from-body"}`, map[string]string{"X-Request-Id": "from-header"})
	require.Equal(t, 200, code)
	require.Equal(t, "from-header", hdr.Get("X-Request-Id"))
	reqs := d.w.requests()
	require.Equal(t, "from-body", reqs[0].ID, "the worker gets the request's id")
	require.Equal(t, "from-header", reqs[1].ID)

	// The same id on concurrent requests: each is counted and released on its own.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, hdr, out := d.send(t, "/v1/completions", `{"prompt":"a b c","max_tokens":4}`, map[string]string{"X-Request-Id": "dup"})
			require.Equal(t, 200, code, out[0])
			require.Equal(t, "dup", hdr.Get("X-Request-Id"))
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return d.svc.Router().Slots().InFlight() == 0 }, 5e9, 1e7)
	code, hdr, _ = d.send(t, "/v1/completions", `{"prompt":"a","max_tokens":1,"request_id":"bad id"}`, nil)
	require.Equal(t, 400, code)
	require.Regexp(t, `^dp-`, hdr.Get("X-Request-Id"))
}

func TestRetrieveModel(t *testing.T) {
	d := startDaemon(t, nil)
	name := d.svc.Models().Name
	resp, err := http.Get(d.base + "/v1/models/" + name)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var m openai.Model
	require.NoError(t, json.Unmarshal(b, &m))
	require.Equal(t, openai.Model{ID: name, Object: "model", Created: m.Created, OwnedBy: "dataplane"}, m)
	list := get200(t, d.base+"/v1/models")
	require.Contains(t, list, string(b), "the same object as in the list")

	for _, id := range []string{"gpt-4o", "Qwen/Qwen2-VL-7B-Instruct", name + "x"} {
		resp, err := http.Get(d.base + "/v1/models/" + id)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 404, resp.StatusCode)
		require.JSONEq(t, fmt.Sprintf(`{"error":{"message":"model: The model `+"`%s`"+` does not exist.","type":"not_found_error","param":"model","code":404}}`, id), string(b))
	}
	_, metrics := get(t, d.base+"/metrics")
	require.Contains(t, metrics, `dataplane_http_requests_total{code="404",route="/v1/models/{id}"} 3`)
}

func get200(t *testing.T, url string) string {
	t.Helper()
	code, body := get(t, url)
	require.Equal(t, 200, code, body)
	return body
}
