package access

import "sync"

// keptLimit bounds each map of keptModels: past it the map starts over
// (unknown keys offered by anyone must not grow it without end).
const keptLimit = 4096

// keptModels holds what the store said at one store version: access
// models by user ("" anonymous) and key owners by fingerprint ("" no
// owner). A new version drops everything, so nothing outlives a write.
type keptModels struct {
	mu      sync.Mutex
	version int64
	models  map[string]*Model
	owners  map[string]string
}

// at empties the maps unless they hold version's answers.
func (k *keptModels) at(version int64) {
	if k.version != version || k.models == nil {
		k.version = version
		k.models, k.owners = map[string]*Model{}, map[string]string{}
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
