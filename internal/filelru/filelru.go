// Package filelru keeps a set of finished files by key, bounded in total
// size and in age, dropping the least recently used first. The fetch cache
// and the pack cache both store what git wrote once and serve it again;
// this is their shared bookkeeping, so both evict by the same rules.
//
// A Set is not safe for concurrent use: its owner's lock guards it, since
// the owner must decide atomically with other state (runs in flight) too.
package filelru

import (
	"os"
	"slices"
	"time"
)

// Set is the files stored under keys. Dropping an entry removes its file;
// a reader that opened it keeps reading (the name goes, not the data).
type Set struct {
	MaxBytes int64         // total size kept; 0 keeps nothing
	MaxAge   time.Duration // age past which an entry is dropped; 0: no limit

	Now func() time.Time // the clock; nil: time.Now

	entries map[string]*entry
	total   int64
}

type entry struct {
	path              string
	size              int64
	created, lastUsed time.Time
}

func (s *Set) clock() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Set) expired(e *entry) bool {
	return s.MaxAge > 0 && s.clock().Sub(e.created) > s.MaxAge
}

// Lookup returns the file stored under key and marks it used. An entry past
// MaxAge is dropped and not returned.
func (s *Set) Lookup(key string) (path string, size int64, ok bool) {
	e, ok := s.entries[key]
	if !ok {
		return "", 0, false
	}
	if s.expired(e) {
		s.Drop(key)
		return "", 0, false
	}
	e.lastUsed = s.clock()
	return e.path, e.size, true
}

// Add stores path (already in place) under key, replacing and removing an
// earlier file of that key, then evicts down to the bounds (which may drop
// the new entry at once when it alone is larger than MaxBytes).
func (s *Set) Add(key, path string, size int64) {
	if s.entries == nil {
		s.entries = map[string]*entry{}
	}
	if old, ok := s.entries[key]; ok && old.path != path {
		s.Drop(key)
	} else if ok {
		s.total -= old.size
		delete(s.entries, key)
	}
	now := s.clock()
	s.entries[key] = &entry{path: path, size: size, created: now, lastUsed: now}
	s.total += size
	s.Evict()
}

// Drop removes the entry of key and its file, if there is one.
func (s *Set) Drop(key string) {
	if e, ok := s.entries[key]; ok {
		os.Remove(e.path)
		s.total -= e.size
		delete(s.entries, key)
	}
}

// DropIfPath drops key only while it still names path: a caller that found
// an entry's file unreadable must not drop a newer file stored meanwhile.
func (s *Set) DropIfPath(key, path string) {
	if e, ok := s.entries[key]; ok && e.path == path {
		s.Drop(key)
	}
}

// Evict drops entries past MaxAge, then the least recently used until the
// total fits MaxBytes.
func (s *Set) Evict() {
	for k, e := range s.entries {
		if s.expired(e) {
			s.Drop(k)
		}
	}
	if s.total <= s.MaxBytes {
		return
	}
	keys := make([]string, 0, len(s.entries))
	for k := range s.entries {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return s.entries[a].lastUsed.Compare(s.entries[b].lastUsed) })
	for _, k := range keys {
		if s.total <= s.MaxBytes {
			break
		}
		s.Drop(k)
	}
}

// Len is the number of stored files.
func (s *Set) Len() int { return len(s.entries) }

// Bytes is their total size.
func (s *Set) Bytes() int64 { return s.total }
