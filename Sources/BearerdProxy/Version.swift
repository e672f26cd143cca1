import BearerdProxyCore
import BearerdConfig
public enum BearerdVersion {
    public static let string = "0.1.0"
}
