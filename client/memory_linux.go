package client

// sharedMemory says this OS has what the pool mapping and client buffers
// need: memfds, their seals, and mmap of them shared with the daemon.
const sharedMemory = true
