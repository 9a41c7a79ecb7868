package control

import (
	"fmt"

	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/wire"
)

// mode answers tcctl mode from Deps.Admission: the mode and its budget,
// after changing it when the request says so. Changing it is the
// operator's: root or the daemon's own user.
func (c *conn) mode(m *wire.ModeRequest) error {
	a := c.s.deps.Admission
	if a == nil {
		return fmt.Errorf("%w: this daemon applies no mode", ErrUnavailable)
	}
	if m.Set != "" {
		if !c.s.isAdmin(c.cred.Uid) {
			return fmt.Errorf("%w: uid %d may not change the mode (root or the daemon's user may)", ErrPermission, c.cred.Uid)
		}
		md, err := grant.ParseMode(m.Set)
		if err != nil {
			return err
		}
		old := a.Mode()
		if err := a.SetMode(md); err != nil {
			return err
		}
		c.log.Info("mode changed", "from", old.String(), "to", md.String())
	}
	st := a.Stats()
	r := wire.SetResponse[wire.ModeResponse](&c.resp)
	r.Mode, r.RemoteGets, r.ServeBytesPerSec = st.Mode.String(), uint32(st.Budget.RemoteGets), st.Budget.ServeBytesPerSec
	r.RemoteGetsInFlight, r.GetsRefused, r.ServesRefused = uint32(st.RemoteGets), st.GetsRefused, st.ServesRefused
	return nil
}
