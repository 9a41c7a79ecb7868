package control

import "github.com/tensorcast/tensorcast/session"

// The sessions map errors to codes with the server's CodeOf.
func init() {
	session.CodeOf, session.CodeForState = CodeOf, codeForState
}
