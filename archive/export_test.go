package archive

// ListSQL is List's statement, for the tests that read its plan.
var ListSQL = listSQL
