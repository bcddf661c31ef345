package lfs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// fetchBatch is how many objects one batch request to a source names
// (git-lfs's own batch size).
const fetchBatch = 100

// FetchObjects brings into the LFS store of dataDir the objects that the
// pointers in the history of the repository at repoPath name and that
// repoName does not hold yet, from the LFS API of sourceURL (the http(s)
// URL of the repository it was imported from, without credentials; user
// and password, if set, are sent as Basic). Each is verified (SHA-256,
// size) as an upload is. It returns how many objects it stored and their
// bytes; objects the source does not have are left out and counted in
// missing.
func FetchObjects(ctx context.Context, dataDir, repoName, repoPath, sourceURL, user, password string) (fetched, missing int, size int64, err error) {
	ids, err := exec.CommandContext(ctx, "git", "--git-dir", repoPath, "rev-list", "--objects", "--all", "--no-object-names",
		"--filter=object:type=blob", "--filter=blob:limit="+strconv.Itoa(MaxPointerSize+1)).Output()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("git rev-list: %w", err)
	}
	pointers, err := readPointers(ctx, append(os.Environ(), "GIT_DIR="+repoPath), bytes.NewReader(ids))
	if err != nil || len(pointers) == 0 {
		return 0, 0, 0, err
	}
	s, err := Open(ctx, dataDir)
	if err != nil {
		return 0, 0, 0, err
	}
	defer s.Close()
	var want []batchObject
	seen := map[string]bool{}
	for _, p := range pointers {
		if seen[p.OID] {
			continue
		}
		seen[p.OID] = true
		held, ok, err := s.Index.Size(ctx, repoName, p.OID)
		if err != nil {
			return 0, 0, 0, err
		}
		if _, stored := s.Objects.Stat(p.OID); ok && stored && held == p.Size {
			continue
		}
		want = append(want, batchObject{OID: p.OID, Size: p.Size})
	}
	api := strings.TrimSuffix(sourceURL, "/")
	if !strings.HasSuffix(api, ".git") {
		api += ".git"
	}
	api += strings.TrimSuffix(Prefix, "/")
	client := &http.Client{Timeout: 0}
	for len(want) > 0 {
		n := min(len(want), fetchBatch)
		answer, err := requestBatch(ctx, client, api+"/objects/batch", user, password, want[:n])
		if err != nil {
			return fetched, missing, size, err
		}
		want = want[n:]
		for _, o := range answer {
			dl := o.Actions["download"]
			if o.Error != nil || dl == nil || !ValidOID(o.OID) {
				missing++
				continue
			}
			if err := fetchObject(ctx, client, s, repoName, o.OID, o.Size, dl); err != nil {
				return fetched, missing, size, fmt.Errorf("LFS object %s: %w", o.OID, err)
			}
			fetched++
			size += o.Size
		}
	}
	return fetched, missing, size, nil
}

func requestBatch(ctx context.Context, c *http.Client, url, user, password string, objects []batchObject) ([]batchObject, error) {
	body, _ := json.Marshal(batchRequest{Operation: "download", Transfers: []string{"basic"}, Objects: objects, HashAlgo: "sha256"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", ContentType)
	req.Header.Set("Content-Type", ContentType)
	if user != "" || password != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the source's LFS API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the source's LFS API answered %s", resp.Status)
	}
	var answer struct{ Objects []batchObject }
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return nil, fmt.Errorf("the source's LFS batch answer: %w", err)
	}
	return answer.Objects, nil
}

// fetchObject downloads one object into the store and records that
// repoName holds it.
func fetchObject(ctx context.Context, c *http.Client, s *Service, repoName, oid string, size int64, a *action) error {
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.Href, nil)
	if err != nil {
		return err
	}
	for k, v := range a.Header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download answered %s", resp.Status)
	}
	if _, err := s.Objects.Put(oid, size, resp.Body); err != nil {
		return err
	}
	return s.Index.Add(context.WithoutCancel(ctx), repoName, oid, size)
}
