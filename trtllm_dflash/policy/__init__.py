"""How many drafts a round verifies: the recipe's concurrency bands, or chosen live (`auto`).

Every draft length is lossless (a round accepts a prefix of the drafts and adds the target's own
token), so a policy only trades acceptance against what verifying costs. One concern a module:

  bands       the one band rule (schema, rules, the LLM-API deploy and the `Bands` policy call it)
  decision    `Drafts`: one round's decision, the one form from the policy to Decoder.step
  acceptance  slot acceptance: a_rj = sigmoid(b_j + s_r), learnt online
  cost        the round cost measured at start-up (VerifyCost, measure_cost)
  shapes      that cost corrected per round shape by what rounds took since (RoundCost)
  trim        the confidence trim: once drafted, the prefix worth verifying
  choice      the choice: one length for a batch, or one per request
  trees       DDTree budgets: tree rounds against chain rounds
  auto        `draft_len: auto`, composing them (AutoConfig: its hyperparameters)

Importing this package imports none of its modules: recipe/ reads `bands` without torch.
docs/design/draft-length-policy.md holds the measurements behind each rule.
"""
