package member

import "fmt"

// Role is what a certificate lets its holder do in the mesh. Roles are
// ordered: RoleMember < RoleTrainer < RoleAdmin, and an inviter may grant
// no role above its own.
type Role uint8

const (
	// RoleMember is a device that contributes batches and installs
	// adapters.
	RoleMember Role = 1
	// RoleTrainer is a GPU peer in the trainers' raft group.
	RoleTrainer Role = 2
	// RoleAdmin is held only by the admin key's own certificate.
	RoleAdmin Role = 3
)

func (r Role) String() string {
	switch r {
	case RoleMember:
		return "member"
	case RoleTrainer:
		return "trainer"
	case RoleAdmin:
		return "admin"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

func (r Role) valid() bool { return r >= RoleMember && r <= RoleAdmin }

// ParseRole reads a role as Role.String writes it.
func ParseRole(s string) (Role, error) {
	for r := RoleMember; r <= RoleAdmin; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("member: unknown role %q (want member, trainer or admin)", s)
}

// orMember returns r, or RoleMember when r is zero.
func (r Role) orMember() Role {
	if r == 0 {
		return RoleMember
	}
	return r
}
