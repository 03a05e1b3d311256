"""The polkit rules of the tests that run the real polkitd (testbed.polkit)."""

# The tests' rules: nobody (whose primary group is nogroup) may take shares, hold for pods
# and release its own claims; "daemon" may take mlx5_0 whole, and nothing else; other users
# nothing.
TEST_RULES = """
polkit.addRule(function(action, subject) {
    var granted = ["io.rdmad1.claim-share", "io.rdmad1.hold", "io.rdmad1.release-own"];
    if (subject.isInGroup("nogroup") && granted.indexOf(action.id) >= 0)
        return polkit.Result.YES;
});
polkit.addRule(function(action, subject) {
    if (action.id == "io.rdmad1.claim-device" && subject.user == "daemon" &&
        action.lookup("device") == "mlx5_0")
        return polkit.Result.YES;
});
"""
