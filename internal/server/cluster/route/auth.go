package route

import (
	"net/http"

	"packwire/internal/access"
)

// fromCluster tells whether r carries the cluster user's credentials,
// answering 401 if not: the endpoints other nodes call are never open to
// clients.
func fromCluster(acc *access.Controller, w http.ResponseWriter, r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	principal, err := acc.PrincipalForToken(r.Context(), user, pass)
	if !ok || err != nil || !principal.IsCluster() {
		http.Error(w, "cluster credentials required", http.StatusUnauthorized)
		return false
	}
	return true
}
