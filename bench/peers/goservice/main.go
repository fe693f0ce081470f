// A tiny business service for retryd's HTTP benchmarks and tests (standard library only).
//
//	goservice -addr 127.0.0.1:0 -delay-ms 20 -fail-match BOOM
//	goservice -unix /run/svc.sock            # HTTP over a Unix socket
//
// POST /handle answers 200 after -delay-ms (503 when the body or the base64-decoded
// X-Retryd-Key contains -fail-match). POST /bulk speaks retryd's bulk protocol
// (docs/http-bulk.md): one SUCCESS per record, RETRY for records matching -fail-match, and
// directives in record values for tests ("status:DEAD", "status:DROP", "omit"). The query of
// /bulk picks a whole-request misbehaviour for tests: mode=badjson, mode=big, mode=5xx,
// mode=hang, mode=unknown (an extra result with an id that was never sent); compact=1 names
// only the records that did not succeed and answers "default_status": "SUCCESS". GET /stats
// answers the request and record counts as JSON. The first line on stdout is
// "listening <host:port>", once the socket accepts connections.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

var (
	delay     time.Duration
	failMatch []byte
	requests  atomic.Int64
	records   atomic.Int64
)

type bulkRecord struct {
	ID       json.RawMessage `json:"id"`
	Key      *string         `json:"key"`
	Value    *string         `json:"value"`
	ValueB64 *string         `json:"value_b64"`
}

type bulkRequest struct {
	Records []bulkRecord `json:"records"`
}

type bulkResult struct {
	ID     json.RawMessage `json:"id"`
	Status string          `json:"status"`
	Error  string          `json:"error,omitempty"`
}

func matches(data []byte) bool {
	return len(failMatch) > 0 && bytes.Contains(data, failMatch)
}

func handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	requests.Add(1)
	records.Add(1)
	if delay > 0 {
		time.Sleep(delay)
	}
	key, _ := base64.StdEncoding.DecodeString(r.Header.Get("X-Retryd-Key"))
	if matches(body) || matches(key) {
		w.Header().Set("X-Retryd-Error", "matched")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func recordValue(rec bulkRecord) []byte {
	if rec.Value != nil {
		return []byte(*rec.Value)
	}
	if rec.ValueB64 != nil {
		out, _ := base64.StdEncoding.DecodeString(*rec.ValueB64)
		return out
	}
	return nil
}

func bulk(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	requests.Add(1)
	mode := r.URL.Query().Get("mode")
	var req bulkRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	records.Add(int64(len(req.Records)))
	if delay > 0 {
		time.Sleep(delay)
	}
	switch mode {
	case "hang":
		select {
		case <-r.Context().Done():
		case <-time.After(60 * time.Second):
		}
		return
	case "5xx":
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	case "badjson":
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"results": [`))
		return
	case "big":
		w.Header().Set("Content-Type", "application/json")
		pad := strings.Repeat("x", 8<<20)
		w.Write([]byte(`{"pad":"` + pad + `","results":[]}`))
		return
	}
	results := make([]bulkResult, 0, len(req.Records)+1)
	for _, rec := range req.Records {
		value := recordValue(rec)
		var key []byte
		if rec.Key != nil {
			key, _ = base64.StdEncoding.DecodeString(*rec.Key)
		}
		switch {
		case bytes.Equal(value, []byte("omit")):
			continue
		case bytes.HasPrefix(value, []byte("status:")):
			word := string(value[len("status:"):])
			results = append(results, bulkResult{ID: rec.ID, Status: word, Error: "asked " + word})
		case matches(value) || matches(key):
			results = append(results, bulkResult{ID: rec.ID, Status: "RETRY", Error: "matched"})
		default:
			results = append(results, bulkResult{ID: rec.ID, Status: "SUCCESS"})
		}
	}
	if mode == "unknown" {
		results = append(results, bulkResult{ID: json.RawMessage(`"no-such-id"`), Status: "DEAD"})
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Query().Get("compact") != "" {
		// name only the records that did not succeed; default_status covers the rest
		named := results[:0]
		for _, res := range results {
			if res.Status != "SUCCESS" {
				named = append(named, res)
			}
		}
		json.NewEncoder(w).Encode(map[string]any{"results": named, "default_status": "SUCCESS"})
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"results": results})
}

func stats(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"requests":%d,"records":%d}`, requests.Load(), records.Load())
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	unixPath := flag.String("unix", "", "listen on this Unix socket instead of -addr")
	delayMs := flag.Float64("delay-ms", 0, "delay before each answer, in milliseconds")
	fail := flag.String("fail-match", "", "answer 503 (bulk: RETRY) when the body or key contains this")
	flag.Parse()
	delay = time.Duration(*delayMs * float64(time.Millisecond))
	failMatch = []byte(*fail)

	mux := http.NewServeMux()
	mux.HandleFunc("/handle", handle)
	mux.HandleFunc("/bulk", bulk)
	mux.HandleFunc("/stats", stats)
	network, where := "tcp", *addr
	if *unixPath != "" {
		network, where = "unix", *unixPath
	}
	ln, err := net.Listen(network, where)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "listening %s\n", ln.Addr().String())
	os.Stdout.Sync()
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(server.Serve(ln))
}
