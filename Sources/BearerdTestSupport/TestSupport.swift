/// Helpers shared by the test targets (certificates, fixtures). Not linked into `bearerd`.
public enum BearerdTestSupport {}
