package store

const crashChildEnv = "TENSORCAST_STORE_CRASH_CHILD"

func crashChild() {}
