package benchkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"

	"packwire/internal/governor"
)

// GovernorRecords returns the last records of packwire's governor in data,
// oldest first, as `bin governor --last N --json` prints them (JSON lines).
func GovernorRecords(bin, data string, last int) ([]governor.Record, error) {
	out, err := exec.Command(bin, "governor", "--data", data, "--last", strconv.Itoa(last), "--json").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(exit.Stderr))
		}
		return nil, fmt.Errorf("packwire governor --data %s: %w", data, err)
	}
	var recs []governor.Record
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var r governor.Record
		if err := dec.Decode(&r); err == io.EOF {
			return recs, nil
		} else if err != nil {
			return nil, fmt.Errorf("packwire governor --data %s: %w", data, err)
		}
		recs = append(recs, r)
	}
}
