// calibration_text.cpp — the built-in calibration corpus for `larder quantize` sensitivity
// (design quantization.md §4: "a small built-in multi-domain corpus").
//
// Written for larder (no third-party text), deliberately mixed so that every module sees the
// kinds of activations real prompts produce: narrative prose, an encyclopedic register,
// dialogue, instructions, source code, arithmetic, structured data and a few non-English lines.
// It must stay disjoint from evaluation text (tinyshakespeare, wikitext): nothing here is
// quoted from either.
#include "larder/quant/sensitivity.h"

namespace larder::quant {

const char* builtin_calibration_text() {
  return R"CAL(Once upon a time, in a small town at the edge of a pine forest, there lived a girl named Mila who loved to collect smooth stones. Every morning she walked down to the river with a cloth bag and looked for stones that were round and grey and shiny when wet. One day she found a stone that was warm, even though the water was cold. She held it in her hand and it began to hum, very softly, like a cat that is happy. Mila ran home to show her brother Tom. "Listen," she said, and she put the stone next to his ear. Tom laughed. "It is singing!" They decided to keep it a secret, and every night they put the warm stone under the pillow, and every night they both had the same dream about a boat made of leaves.

The next week it rained for four days. The river grew wide and brown, and the bridge to the market was closed. The baker could not get flour, so there was no bread. Mila remembered the dream of the leaf boat. She and Tom went out with their mother, who was not sure this was a good idea, and they gathered big green leaves from the fig tree behind the school. When Mila put the stone on the pile of leaves, the leaves folded themselves into a little boat, just big enough for a sack of flour. The children laughed and clapped, and their mother sat down on the wet grass because she did not know what else to do.

A lighthouse is a tower built near a coast or a harbour that carries a bright lamp at the top, so that ships can find their way at night and keep away from rocks. Early lighthouses burned wood or coal in an open fire. Later designs used oil lamps with polished mirrors behind them, and in the nineteenth century many towers were fitted with large glass lenses made of rings of prisms, which bend the light into a narrow horizontal beam that can be seen more than thirty kilometres away. Each lighthouse has its own pattern of flashes, called its character, so that a sailor who counts the seconds between flashes can tell which light it is. Most lighthouses today are automatic, powered by electricity or solar panels, and the keepers who once lived in them have moved away.

Photosynthesis is the process by which green plants, algae and some bacteria use the energy of sunlight to turn carbon dioxide and water into sugar and oxygen. It takes place mostly in the leaves, inside small bodies called chloroplasts, which contain the green pigment chlorophyll. The overall reaction can be written as six molecules of carbon dioxide plus six molecules of water giving one molecule of glucose and six molecules of oxygen. The sugar is used by the plant for energy and to build cellulose, starch and other materials. Nearly all the oxygen in the air we breathe was released by photosynthesis over hundreds of millions of years.

"Excuse me, is this the train to the airport?"
"No, this one goes to the old harbour. You want platform six, the blue line."
"Platform six. Thank you. How long does it take?"
"About twenty-five minutes, if there are no delays. The trains leave every ten minutes until midnight."
"And can I buy a ticket on the train?"
"You can, but it costs more. There is a machine by the stairs that takes cards."
"Great, thanks a lot. Have a nice evening!"
"You too. And keep your ticket until you leave the station, they check it at the gate."

User: Can you help me write a short note to my neighbour? Their dog barks every night around two in the morning.
Assistant: Of course. Here is a friendly version: "Hi Sam, I hope you are doing well. I wanted to mention that Biscuit has been barking around 2 a.m. most nights this week. I know dogs have their reasons, and I am not upset, but it has been waking us up. Would you be open to chatting about it sometime this weekend? Thanks so much, Priya from number 14."
User: That is good, but can you make it a little shorter?
Assistant: "Hi Sam, Biscuit has been barking around 2 a.m. lately and it wakes us up. Could we talk about it this weekend? Thanks, Priya (number 14)."

How to make a simple tomato soup for four people. Ingredients: one kilogram of ripe tomatoes, one onion, two cloves of garlic, two tablespoons of olive oil, half a litre of vegetable stock, salt, pepper and a few leaves of basil. Steps: 1. Chop the onion and the garlic. 2. Warm the oil in a large pot over medium heat and cook the onion for five minutes until soft. 3. Add the garlic and cook for one more minute. 4. Cut the tomatoes into quarters, add them to the pot with the stock, and bring everything to a gentle boil. 5. Lower the heat and let it simmer for twenty minutes. 6. Blend until smooth, season with salt and pepper, and tear the basil over each bowl before serving.

def moving_average(values, window):
    """Return the averages of every `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count=1):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count=1):
        have = self.items.get(name, 0)
        if count > have:
            raise KeyError(f"only {have} of {name} left")
        self.items[name] = have - count

#include <stdio.h>
#include <string.h>

/* Reverse a string in place and return it. */
static char *reverse(char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n / 2; i++) {
        char t = s[i];
        s[i] = s[n - 1 - i];
        s[n - 1 - i] = t;
    }
    return s;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) printf("%s\n", reverse(argv[i]));
    return 0;
}

SELECT customer_id, COUNT(*) AS orders, SUM(total) AS spent
FROM orders
WHERE created_at >= '2024-01-01'
GROUP BY customer_id
HAVING COUNT(*) > 3
ORDER BY spent DESC
LIMIT 20;

Question: A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost?
Answer: 12 pencils are 4 groups of 3. Each group costs 45 cents, so 4 x 45 = 180 cents, which is 1 dollar and 80 cents.

Question: A train travels 240 kilometres in 3 hours. What is its average speed?
Answer: Speed is distance divided by time: 240 / 3 = 80 kilometres per hour.

Question: Sara has 17 apples. She gives 5 to Ben and then buys twice as many as she has left. How many apples does she have now?
Answer: After giving 5 away she has 17 - 5 = 12. She buys twice 12, which is 24, so she has 12 + 24 = 36 apples.

Solve for x: 3x + 7 = 25. Subtract 7 from both sides to get 3x = 18, then divide by 3: x = 6. Check: 3 * 6 + 7 = 18 + 7 = 25. The derivative of x^3 - 4x is 3x^2 - 4, which is zero when x = 2/sqrt(3) or x = -2/sqrt(3). The sum 1 + 2 + ... + 100 equals 100 * 101 / 2 = 5050.

{"id": 1042, "name": "Aurora Desk Lamp", "price": 34.99, "currency": "EUR", "tags": ["lighting", "office"], "in_stock": true, "dimensions": {"height_cm": 42, "base_cm": 15}}
{"id": 1043, "name": "Cedar Bookshelf", "price": 129.0, "currency": "EUR", "tags": ["furniture"], "in_stock": false, "dimensions": {"height_cm": 180, "width_cm": 80}}

date,city,temperature_c,rain_mm
2024-03-01,Lisbon,16.2,0.0
2024-03-01,Oslo,-2.5,1.2
2024-03-02,Lisbon,17.8,3.4
2024-03-02,Oslo,-1.0,0.0

Meeting notes, Tuesday. Present: Ana, Kofi, Lin, Mateo. 1) The release is moved to the 14th because the payment tests are still failing on the staging server. 2) Kofi will write the migration guide; Lin reviews it by Friday. 3) We agreed to drop support for the old export format in the next major version, with a warning in the logs starting now. 4) Budget for the conference trip is approved. Action items: Mateo to book the rooms, Ana to send the summary to the client.

Dear Dr. Okafor, thank you for your letter of 3 May. I am pleased to confirm that the laboratory can host two visiting students from June to August. They will need to complete the safety course in their first week and will share a desk in room 214. Please let me know their arrival dates so that we can arrange access cards. With best regards, Helen Marsh, Department of Chemistry.

Le matin, le marché du village est plein de couleurs : des pommes rouges, des poireaux, du fromage de chèvre et des fleurs. Die Kinder spielen im Park, während die Eltern auf der Bank sitzen und Kaffee trinken. El río cruza la ciudad de norte a sur y tiene doce puentes. 今日はとても良い天気なので、公園を散歩しました。 Сегодня вечером мы будем смотреть фильм дома.

The old clockmaker opened his shop at seven, as he had done for forty years. He wound each clock on the wall, listened to its ticking for a moment, and wrote a small note in a leather book: fast, slow, or just right. When a young man came in with a broken pocket watch that had belonged to his grandfather, the clockmaker turned it over, smiled, and said that he had repaired this very watch once before, a long time ago, for a woman who paid him with a jar of plum jam. The young man did not know what to say. "Come back on Thursday," said the clockmaker. "And if you still have any of that jam, bring it along."

Tips for studying: work in short sessions of twenty-five to forty minutes with a break in between; explain what you learned out loud as if teaching a friend; test yourself instead of only rereading; sleep well before an exam, because memory is strengthened during sleep; and start early, since a little every day beats a lot the night before.
)CAL";
}

}  // namespace larder::quant
