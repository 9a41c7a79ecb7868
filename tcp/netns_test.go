package tcp

const netnsRoleEnv = "TENSORCAST_TCP_NETNS_ROLE"

func netnsChild(role string) int { return 2 }
