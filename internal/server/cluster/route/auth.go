package route

import (
	"net/http"

	"packwire/internal/access"
)

// fromCluster tells whether r carries the cluster user's credentials,
// answering 401 if not: the endpoints other nodes call are never open to
// clients. Another user name is refused before the store is asked.
func fromCluster(acc *access.Controller, w http.ResponseWriter, r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	if ok && user == access.ClusterUser {
		if principal, err := acc.PrincipalForToken(r.Context(), user, pass); err == nil && principal.IsCluster() {
			return true
		}
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="packwire cluster"`)
	http.Error(w, "cluster credentials required", http.StatusUnauthorized)
	return false
}
