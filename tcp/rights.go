package tcp

// RightsExporter is an Exporter that also says which rights each export
// grants. When the Node's Exporter implements it, a peer that asks to open
// a segment with a right the export does not grant (WRITE on a read-only
// export, say) is refused with a permission error, and so is an export the
// rights lookup no longer knows.
type RightsExporter interface {
	Exporter
	// Granted reports the rights the export named name grants, and false
	// when there is no such export.
	Granted(name string) (Rights, bool)
}
