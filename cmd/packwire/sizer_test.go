package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"packwire/internal/gittest"
	"packwire/internal/lab/sizer"
)

func TestSizerCommand(t *testing.T) {
	gittest.New(t)
	dir := filepath.Join(t.TempDir(), "jq.git")
	if out, code := packwire(t, "synth", "--shape", "jquery", "--scale", "0.02", "--out", dir, "--quiet"); code != 0 {
		t.Fatalf("synth: %d %s", code, out)
	}
	// --json round trip: the command's JSON decodes to what Measure finds,
	// and encodes back to the same bytes.
	cmd := exec.Command(binary, "sizer", dir, "--json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sizer --json: %v", err)
	}
	var got sizer.Report
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decoding sizer --json: %v\n%s", err, out)
	}
	want, err := sizer.Measure(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, want) {
		t.Fatalf("sizer --json decodes to\n%+v\nMeasure gives\n%+v", got, *want)
	}
	var again bytes.Buffer
	got.WriteJSON(&again)
	if again.String() != string(out) {
		t.Fatalf("re-encoded JSON differs:\n%s\n%s", again.String(), out)
	}
	for _, field := range []string{`"commit_count"`, `"max_history_depth"`, `"biggest_checkout"`, `"concern"`} {
		if !strings.Contains(string(out), field) {
			t.Errorf("JSON lacks %s", field)
		}
	}
	if got.Overall.CommitCount.Value != 157 {
		t.Errorf("%d commits, synth wrote 157", got.Overall.CommitCount.Value)
	}

	table, code := packwire(t, "sizer", dir)
	if code != 0 || !strings.Contains(table, "| Biggest checkouts") || !strings.Contains(table, "|   * Count                    |   157     |") {
		t.Fatalf("sizer: %d\n%s", code, table)
	}
	if table, code := packwire(t, "sizer", "--threshold", "1", dir); code != 0 || strings.Contains(table, "Number of files") || !strings.Contains(table, "Maximum tag depth") {
		t.Fatalf("sizer --threshold 1: %d\n%s", code, table)
	}
	if out, code := packwire(t, "sizer"); code != 2 {
		t.Fatalf("sizer without a repository: %d %s", code, out)
	}
	if out, code := packwire(t, "sizer", t.TempDir()); code != 1 || !strings.Contains(out, "not a git repository") {
		t.Fatalf("sizer on a plain directory: %d %s", code, out)
	}
	if out, code := packwire(t, "sizer", "--help"); code != 0 || !strings.Contains(out, "-json") || !strings.Contains(out, "-threshold") {
		t.Fatalf("sizer --help: %d %s", code, out)
	}
}
