package server

import "packwire/internal/access"

type accessPrincipal = access.Principal
