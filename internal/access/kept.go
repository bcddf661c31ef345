package access

import (
	"sync"

	"packwire/internal/store"
)

// keptLimit bounds each map of keptModels: past it the map starts over
// (unknown keys offered by anyone must not grow it without end).
const keptLimit = 4096

// keptModels holds what the store said at one store version: access
// models by user ("" anonymous), key owners by fingerprint ("" no
// owner) and tokens by id (as stored: the secret, revocation and expiry
// are checked on every use). A new version drops everything, so nothing
// outlives a write.
type keptModels struct {
	mu      sync.Mutex
	version int64
	models  map[string]*Model
	owners  map[string]string
	tokens  map[string]store.Token
}

// at empties the maps unless they hold version's answers.
func (k *keptModels) at(version int64) {
	if k.version != version || k.models == nil {
		k.version = version
		k.models, k.owners, k.tokens = map[string]*Model{}, map[string]string{}, map[string]store.Token{}
	}
}

func (k *keptModels) model(version int64, user string) *Model {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at(version)
	return k.models[user]
}

func (k *keptModels) keepModel(version int64, user string, m *Model) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at(version)
	if len(k.models) >= keptLimit {
		clear(k.models)
	}
	k.models[user] = m
}

func (k *keptModels) keyOwner(version int64, fingerprint string) (user string, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at(version)
	user, ok = k.owners[fingerprint]
	return user, ok
}

func (k *keptModels) keepKeyOwner(version int64, fingerprint, user string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at(version)
	if len(k.owners) >= keptLimit {
		clear(k.owners)
	}
	k.owners[fingerprint] = user
}

func (k *keptModels) token(version int64, id string) (t store.Token, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at(version)
	t, ok = k.tokens[id]
	return t, ok
}

func (k *keptModels) keepToken(version int64, t store.Token) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.at(version)
	if len(k.tokens) >= keptLimit {
		clear(k.tokens)
	}
	k.tokens[t.ID] = t
}
