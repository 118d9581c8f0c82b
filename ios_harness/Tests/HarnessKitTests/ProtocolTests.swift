import Foundation
import XCTest

@testable import HarnessKit

final class ProtocolTests: XCTestCase {
    func testAJobFromTheAgentDecodes() throws {
        let json = """
        {"protocol_version": 1, "run_id": 7, "model": "tiny-gqa", "variant_label": "folded",
         "device_class": "iphone-17-pro", "device_udid": "00008150-0001", "driver": "pymobiledevice3",
         "artifact_sha256": "ab", "package_path": "models/ab/model.mlpackage", "bytes_per_token": 10,
         "context_tokens": 128, "decode_tokens": 4, "warmup_steps": 2, "prompt_set_version": "builtin-v1",
         "variant": {"attention": "folded", "context": 128},
         "prompts": [{"index": 0, "token_ids": [1, 2, 3]}]}
        """
        let job = try JSONDecoder().decode(HarnessJob.self, from: Data(json.utf8))
        XCTAssertEqual(job.runId, 7)
        XCTAssertEqual(job.prompts[0].tokenIds, [1, 2, 3])
    }

    struct Scripted: StepEngine {
        var steps: [(Int, Int)] = []
        mutating func reset() throws {}
        mutating func step(token: Int, position: Int) throws -> Int {
            steps.append((token, position))
            return token + 100
        }
    }

    func testTheSweepStepsPrefillThenDecode() throws {
        var engine = Scripted()
        let result = try runPrompt(&engine, prompt: HarnessPrompt(index: 2, tokenIds: [1, 2, 3]), decodeTokens: 3)
        XCTAssertEqual(engine.steps.map { $0.1 }, [0, 1, 2, 3, 4])
        XCTAssertEqual(result.tokenIds, [103, 203, 303])
        XCTAssertEqual(result.tokenLatenciesMs.count, 3)
        let keys = try JSONSerialization.jsonObject(with: JSONEncoder().encode(result)) as! [String: Any]
        XCTAssertNotNil(keys["token_latencies_ms"])
    }
}
