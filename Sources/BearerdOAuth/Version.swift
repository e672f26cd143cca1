/// The version `bearerd --version`, the User-Agent of token requests and `bearerd_build_info` report.
public enum BearerdVersion {
    public static let string = "0.1.0"
}
