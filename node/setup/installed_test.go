package setup

import "testing"

// TestInstalledDir: the data directory a service was installed for reads
// back from both managers' files, odd characters included.
func TestInstalledDir(t *testing.T) {
	for _, dir := range []string{"/home/a/.clawmesh", "/Users/a b/100% <data> & more"} {
		s := Service{Label: ServiceLabel, Program: "/usr/bin/clawmesh", Args: []string{"node", "--data", dir}, LogFile: dir + "/node.log", Dir: dir}
		if got := InstalledDir(LaunchdPlist(s)); got != dir {
			t.Errorf("plist: %q, want %q", got, dir)
		}
		if got := InstalledDir([]byte(SystemdUnit(s))); got != dir {
			t.Errorf("unit: %q, want %q", got, dir)
		}
	}
	if got := InstalledDir([]byte("[Service]\nExecStart=/x\n")); got != "" {
		t.Errorf("no directory: %q", got)
	}
}
