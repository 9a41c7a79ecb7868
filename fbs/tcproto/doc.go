// Package tcproto is the Go code flatc generates from fbs/control.fbs: the
// tables, unions and enums of the control protocol, with their builders and
// accessors. Every other file here is generated and committed (make
// generate reproduces it); package wire is the only codec built on it.
package tcproto
